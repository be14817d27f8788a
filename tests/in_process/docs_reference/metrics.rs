//! `docs/reference/metrics.md`: every metric family of the relay's registry, read from the
//! exposition of a fresh registry in which every family was exercised once
//! (`idemrelay::docs_reference::metrics_exposition`): the `# HELP`, `# TYPE` and `# UNIT` lines,
//! and the label names and values of the samples.

use std::collections::BTreeMap;

use super::{cell, check, code, page_head};

/// Labels whose values come from data or from the build, not from a fixed list: the page
/// says what they hold instead of listing what the fresh registry happened to hold.
const OPEN_LABELS: &[(&str, &str, &str)] = &[
    (
        "idemrelay_queued_by_scope",
        "scope",
        "a scope name (the largest scopes), or `other` for the rest",
    ),
    ("idemrelay_build_info", "version", "the relay's version"),
    (
        "idemrelay_build_info",
        "commit",
        "the git commit it was built from",
    ),
];

#[derive(Default)]
struct Family {
    kind: String,
    unit: String,
    help: String,
    /// Label name → values seen, in order of first appearance.
    labels: BTreeMap<String, Vec<String>>,
    label_order: Vec<String>,
    /// A histogram's bucket bounds.
    buckets: Vec<String>,
    /// The label sets seen, for families with more than one label (not every combination
    /// of values exists: an attempt accepted at RCPT cannot happen).
    combinations: std::collections::BTreeSet<Vec<String>>,
}

/// Parses `name{a="x",b="y"} value` into its name and labels.
fn sample(line: &str) -> (String, Vec<(String, String)>) {
    let (series, _) = line.rsplit_once(' ').unwrap_or((line, ""));
    let Some((name, rest)) = series.split_once('{') else {
        return (series.to_string(), Vec::new());
    };
    let body = rest.trim_end_matches('}');
    let mut labels = Vec::new();
    // Label values here hold no `",` (they are fixed words, a version and a commit).
    for pair in body.split("\",") {
        if let Some((k, v)) = pair.split_once("=\"") {
            labels.push((k.to_string(), v.trim_end_matches('"').to_string()));
        }
    }
    (name.to_string(), labels)
}

fn families(exposition: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.into()).or_default().help = help.into();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.into()).or_default().kind = kind.into();
        } else if let Some(rest) = line.strip_prefix("# UNIT ") {
            let (name, unit) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.into()).or_default().unit = unit.into();
        } else if !line.starts_with('#') && !line.is_empty() {
            let (name, labels) = sample(line);
            // The family a sample belongs to: the longest family name it starts with.
            let Some(family) = families
                .keys()
                .filter(|f| name.starts_with(f.as_str()))
                .max_by_key(|f| f.len())
                .cloned()
            else {
                continue;
            };
            let family = families.get_mut(&family).expect("found above");
            let combination: Vec<String> = labels
                .iter()
                .filter(|(k, _)| k != "le")
                .map(|(k, v)| format!("{k}=\"{v}\""))
                .collect();
            if combination.len() > 1 {
                family.combinations.insert(combination);
            }
            for (k, v) in labels {
                if k == "le" {
                    if !family.buckets.contains(&v) {
                        family.buckets.push(v);
                    }
                    continue;
                }
                if !family.label_order.contains(&k) {
                    family.label_order.push(k.clone());
                }
                let values = family.labels.entry(k).or_default();
                if !values.contains(&v) {
                    values.push(v);
                }
            }
        }
    }
    families
}

/// The names a family's samples take, as queries use them.
fn sample_names(name: &str, kind: &str) -> Vec<String> {
    match kind {
        "counter" => vec![format!("{name}_total")],
        "histogram" => ["_bucket", "_sum", "_count"]
            .iter()
            .map(|s| format!("{name}{s}"))
            .collect(),
        _ => vec![name.to_string()],
    }
}

pub fn render() -> String {
    let families = families(&idemrelay::docs_reference::metrics_exposition());
    let mut out = page_head("Metrics reference", "the relay's metrics registry");
    out.push('\n');
    out.push_str(
        "Every metric the relay exposes at `/metrics` on its admin listener (OpenMetrics by \
         default, the Prometheus text format 0.0.4 for a client that asks for `text/plain`). \
         Labelled counters exist with every label value from the first scrape, at 0, so a \
         `rate()` over one that has not moved yet is 0 rather than absent.\n\n",
    );
    out.push_str("| Metric | Type | Labels | Description |\n|---|---|---|---|\n");
    for (name, f) in &families {
        let labels: Vec<String> = f.label_order.iter().map(|l| code(l)).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            // Queries name a counter by its sample, the others by the family.
            code(&if f.kind == "counter" {
                format!("{name}_total")
            } else {
                name.clone()
            }),
            f.kind,
            labels.join(", "),
            cell(&f.help)
        ));
    }
    for (name, f) in &families {
        out.push_str(&format!("\n## {}\n\n{}\n\n", code(name), cell(&f.help)));
        out.push_str(&format!("- Type: {}\n", f.kind));
        if !f.unit.is_empty() {
            out.push_str(&format!("- Unit: {}\n", f.unit));
        }
        let samples: Vec<String> = sample_names(name, &f.kind)
            .iter()
            .map(|s| code(s))
            .collect();
        out.push_str(&format!("- Samples: {}\n", samples.join(", ")));
        if !f.buckets.is_empty() {
            out.push_str(&format!("- Buckets (`le`): {}\n", f.buckets.join(", ")));
        }
        for label in &f.label_order {
            let open = OPEN_LABELS
                .iter()
                .find(|(family, l, _)| family == name && l == label);
            let values = match open {
                Some((_, _, what)) => what.to_string(),
                // Sorted: the registry keeps a family's series in a hash map.
                None => f.labels[label]
                    .iter()
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .map(|v| code(v))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            out.push_str(&format!("- Label {}: {}\n", code(label), values));
        }
        // Not for labels with open values (the build's version and commit would be written).
        let open = OPEN_LABELS.iter().any(|(family, _, _)| family == name);
        if !f.combinations.is_empty() && !open {
            let shown: Vec<String> = f
                .combinations
                .iter()
                .map(|c| code(&format!("{{{}}}", c.join(","))))
                .collect();
            out.push_str(&format!("- Label sets that occur: {}\n", shown.join(", ")));
        }
    }
    out
}

#[test]
fn metrics_page_is_current() {
    check("metrics.md", &render());
}

/// Every family is found with its type and labels, histograms with their buckets, and the
/// build's own values are not written into the page.
#[test]
fn metrics_page_walk_finds_types_labels_and_buckets() {
    let page = render();
    for needle in [
        "| `idemrelay_submissions_total` | counter | `result` |",
        "| `idemrelay_queue_depth` | gauge | `state` |",
        "## `idemrelay_upstream_attempt_duration_seconds`",
        "| `idemrelay_upstream_attempt_duration_seconds` | histogram | `outcome` |",
        "`{outcome=\"unknown\",phase=\"dot\"}`",
        "- Label `outcome`: ",
        "- Label `phase`: ",
        "- Label `state`: `cancelled`, `delivered`, ",
        "- Buckets (`le`): 0.005, ",
        "- Label `commit`: the git commit",
    ] {
        assert!(page.contains(needle), "missing {needle:?} in\n{page}");
    }
}

/// The names `src/metrics.rs` registers: the string after each `register(` or
/// `register_with_unit(`.
fn registered_names() -> Vec<String> {
    const SOURCE: &str = include_str!("../../../src/metrics.rs");
    let mut names = Vec::new();
    for call in ["register(", "register_with_unit("] {
        for (at, _) in SOURCE.match_indices(&format!(".{call}")) {
            let rest = &SOURCE[at + call.len() + 1..];
            let Some(open) = rest.find('"') else { continue };
            let Some(len) = rest[open + 1..].find('"') else {
                continue;
            };
            names.push(rest[open + 1..open + 1 + len].to_string());
        }
    }
    names
}

/// prometheus-client leaves a labelled family that nothing has touched out of the exposition
/// altogether, so the page would miss it: every family `src/metrics.rs` registers must be in
/// `metrics_exposition`'s output.
#[test]
fn every_registered_metric_is_on_the_page() {
    let families = families(&idemrelay::docs_reference::metrics_exposition());
    let registered = registered_names();
    assert!(
        registered.len() > 20,
        "the source walk found {registered:?}"
    );
    let missing: Vec<&String> = registered
        .iter()
        .filter(|name| {
            let family = format!("idemrelay_{name}");
            !families
                .keys()
                .any(|f| *f == family || f.starts_with(&format!("{family}_")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "metric families missing from the exposition: {missing:?}; touch each once in metrics_exposition() (src/docs_reference.rs) so it and its labels show in docs/reference/metrics.md"
    );
}
