//! The checks of one run: the store, what the clients were told and what the sink holds,
//! compared per unit (scope, key, part); every breach is a line in `violations`.

use super::*;

/// What the checks found: the counts, the breaches, the events' counts and, per scope, the
/// units answered 250 and delivered.
pub(super) struct Audit {
    pub(super) c: Counts,
    pub(super) violations: Vec<String>,
    pub(super) hooks: HookCounts,
    pub(super) per_scope: BTreeMap<String, (usize, usize)>,
    /// Parts past the first that were delivered.
    pub(super) later_parts: usize,
}

pub(super) async fn audit(ran: &Ran) -> Audit {
    let Ran {
        scenario,
        plans,
        answers,
        sink,
        reader,
        cluster,
        ..
    } = ran;
    let records = list_all(reader.as_ref()).await;
    let mut violations: Vec<String> = Vec::new();
    let mut c = Counts {
        t: plans.iter().map(|p| units(p).len()).sum(),
        submissions: answers.values().map(Vec::len).sum(),
        ..Counts::default()
    };
    for plan in plans {
        match plan.shape {
            Shape::Split { parts, racing, .. } => {
                c.split_keys += 1;
                c.split_parts += parts;
                c.racing_splits += usize::from(racing);
            }
            Shape::TwoScopes(..) => c.shared_keys += 1,
            _ => {}
        }
    }
    let plan_of: BTreeMap<&str, &Plan> = plans.iter().map(|p| (p.key.as_str(), p)).collect();
    let names = |units: &BTreeSet<Unit>| units.iter().map(Unit::to_string).collect::<Vec<_>>();

    // The store: one record per unit, each under an upstream key of its own.
    let mut stored: BTreeMap<Unit, (&store::MessageSummary, store::StoredMessage)> =
        BTreeMap::new();
    let mut unit_of_id: BTreeMap<&str, Unit> = BTreeMap::new();
    let mut unit_of_upstream: BTreeMap<String, Unit> = BTreeMap::new();
    let mut scope_tags: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in &records {
        let Some(key) = r.key.clone() else {
            violations.push(format!("record {} without a key", r.id));
            continue;
        };
        let Some(m) = reader.message(&r.id).await.unwrap() else {
            violations.push(format!("record {} listed, but not there to read", r.id));
            continue;
        };
        let unit = Unit {
            scope: m.scope.clone(),
            key,
            part: m.part,
        };
        match plan_of.get(unit.key.as_str()) {
            None => violations.push(format!("record {} under a key nobody sent: {unit}", r.id)),
            Some(plan) if !units(plan).contains(&unit) => violations.push(format!(
                "record {} is {unit}, which nobody asked for ({:?})",
                r.id, plan.shape
            )),
            Some(_) => {}
        }
        match r.state {
            State::Delivered => {}
            State::Unresolved => c.unresolved += 1,
            other => violations.push(format!("{unit} ({}): ended {other:?}", r.id)),
        }
        match &m.upstream_key {
            None => violations.push(format!("{unit} ({}): no upstream key", r.id)),
            Some(up) => {
                // Several scopes share the upstream: every key the upstream sees carries its
                // scope's tag and its part.
                let suffix = format!("-{}-{}", unit.part, unit.key);
                match up
                    .strip_prefix("u1-")
                    .and_then(|rest| rest.strip_suffix(&suffix))
                {
                    Some(tag) if tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()) => {
                        scope_tags
                            .entry(unit.scope.clone())
                            .or_default()
                            .insert(tag.to_string());
                    }
                    _ => violations.push(format!(
                        "{unit} ({}): the upstream sees {up:?}, not u1-<scope tag>{suffix}",
                        r.id
                    )),
                }
                if let Some(other) = unit_of_upstream.insert(up.clone(), unit.clone()) {
                    violations.push(format!("{other} and {unit}: one upstream key {up}"));
                }
            }
        }
        unit_of_id.insert(r.id.as_str(), unit.clone());
        if let Some((other, _)) = stored.insert(unit.clone(), (r, m)) {
            violations.push(format!("{unit}: two records, {} and {}", other.id, r.id));
        }
    }
    let mut tag_of: BTreeMap<&str, &str> = BTreeMap::new();
    for (scope, tags) in &scope_tags {
        if tags.len() != 1 {
            violations.push(format!(
                "scope {scope}: upstream keys with the tags {tags:?}"
            ));
        }
        for tag in tags {
            if let Some(other) = tag_of.insert(tag, scope) {
                violations.push(format!("scopes {other} and {scope} share the tag {tag}"));
            }
        }
    }

    // What the clients were told.
    let mut ids_of_ask: BTreeMap<(&str, Ask), BTreeSet<&str>> = BTreeMap::new();
    let mut asks_of_id: BTreeMap<&str, BTreeSet<(&str, Ask)>> = BTreeMap::new();
    let mut answered: BTreeSet<Unit> = BTreeSet::new();
    for (key, subs) in answers {
        let plan = plan_of[key.as_str()];
        let mut told: BTreeSet<Unit> = BTreeSet::new();
        for s in subs {
            c.tries += u64::from(s.tries);
            c.lost_tries += u64::from(s.lost);
            c.deferred_tries += u64::from(s.deferred);
            for (kind, n) in &s.deferrals {
                *c.deferrals.entry(kind.clone()).or_default() += u64::from(*n);
            }
            match &s.last {
                Final::GaveUp => violations.push(format!(
                    "{key} ({}): neither accepted nor refused within {KEY_LIMIT:?}",
                    s.ask
                )),
                Final::Refused(line) => {
                    let conflict = line.starts_with("554 ") && line.contains("E01005");
                    if conflict {
                        c.e01005 += 1;
                    }
                    if plan.shape != Shape::DifferentBytesTwice || !conflict {
                        violations.push(format!(
                            "{key} ({}, {:?}{}): refused: {line}",
                            s.ask,
                            plan.shape,
                            if s.resend { ", sent again" } else { "" }
                        ));
                    }
                }
                Final::Accepted => {}
            }
            let Some((line, id)) = &s.accepted else {
                continue;
            };
            ids_of_ask
                .entry((key.as_str(), s.ask))
                .or_default()
                .insert(id);
            asks_of_id
                .entry(id)
                .or_default()
                .insert((key.as_str(), s.ask));
            if s.resend {
                c.resent += 1;
                if line.contains("(idempotent replay)") {
                    c.replayed += 1;
                } else {
                    violations.push(format!(
                        "{key} ({}): sent again after its 250, answered {line:?}: not a replay",
                        s.ask
                    ));
                }
            }
            let Some(unit) = unit_of_id.get(id.as_str()) else {
                violations.push(format!(
                    "{key} ({}): answered 250 as {id}, no such record",
                    s.ask
                ));
                continue;
            };
            if unit.scope != s.ask.who.scope() || unit.key != *key {
                violations.push(format!(
                    "{key} ({}): answered with {id}, the record of {unit}",
                    s.ask
                ));
            }
            if let Some(part) = s.expect_part {
                if unit.part != part {
                    violations.push(format!(
                        "{key} ({}): sent as part {part} once the parts before were answered, \
                         numbered {}",
                        s.ask, unit.part
                    ));
                }
            }
            told.insert(unit.clone());
        }
        let accepted = subs.iter().filter(|s| s.accepted.is_some()).count();
        if plan.shape == Shape::DifferentBytesTwice && accepted != 1 {
            violations.push(format!(
                "{key}: {accepted} of two different messages under one key accepted"
            ));
        }
        let want = units(plan);
        if told != want {
            violations.push(format!(
                "{key} ({:?}): clients were told 250 for {:?}, the plan has {:?}",
                plan.shape,
                names(&told),
                names(&want)
            ));
        }
        answered.extend(told);
    }
    c.a = answered.len();
    for ((key, ask), ids) in &ids_of_ask {
        if ids.len() > 1 {
            violations.push(format!(
                "{key} ({ask}): answered with several queue ids {ids:?}"
            ));
        }
    }
    for (id, asks) in &asks_of_id {
        if asks.len() > 1 {
            violations.push(format!("{id}: the answer to different requests {asks:?}"));
        }
    }

    // The sink, after its dedup and raw; it sees the upstream keys.
    let stats = sink.stats();
    let transactions = sink.transactions();
    let messages = sink.messages();
    c.r = transactions.len();
    let mut delivered: BTreeSet<Unit> = BTreeSet::new();
    let mut delivered_keys = 0;
    for (up, s) in &stats.keys {
        let unit = unit_of_upstream.get(up);
        let name = unit.map_or_else(|| up.clone(), |u| format!("{u} ({up})"));
        if s.accepted >= 1 {
            delivered_keys += 1;
            match unit {
                Some(u) => {
                    delivered.insert(u.clone());
                }
                None => {
                    c.unexpected += 1;
                    violations.push(format!("{up}: delivered, but no record has this key"));
                }
            }
        }
        if s.accepted > 1 {
            c.duplicated += s.accepted as usize - 1;
            violations.push(format!("{name}: delivered {} times: {s:?}", s.accepted));
        }
    }
    c.d = delivered.len();
    for u in &answered {
        if !delivered.contains(u) {
            c.lost += 1;
            violations.push(format!("{u}: answered 250, never delivered"));
        }
    }
    for u in &delivered {
        if !plan_of
            .get(u.key.as_str())
            .is_some_and(|p| units(p).contains(u))
        {
            c.unexpected += 1;
            violations.push(format!("{u}: delivered, but nobody submitted it"));
        } else if !answered.contains(u) {
            // Committed but never confirmed, although its client kept retrying: a retry must
            // get the replay.
            c.unanswered += 1;
            violations.push(format!("{u}: delivered, but its clients never got a 250"));
        }
    }
    if messages.len() != delivered_keys + c.duplicated {
        violations.push(format!(
            "the sink holds {} messages for {delivered_keys} keys",
            messages.len()
        ));
    }
    let no_key = transactions.iter().filter(|t| t.key.is_none()).count();
    if no_key > 0 {
        c.unexpected += no_key;
        violations.push(format!("{no_key} sink transactions without a key"));
    }

    // Per unit: bytes forwarded, raw transactions explained by the ledger, window kept.
    let mut by_key: BTreeMap<&str, Vec<&idemrelay_sink::Transaction>> = BTreeMap::new();
    for t in &transactions {
        if let Some(k) = &t.key {
            by_key.entry(k.as_str()).or_default().push(t);
        }
    }
    for (up, txs) in &by_key {
        if !unit_of_upstream.contains_key(*up) {
            c.mismatched_forwarded += txs.len();
            violations.push(format!("{up}: {} transactions, but no record", txs.len()));
        }
    }
    let retried: BTreeSet<&str> = answers
        .iter()
        .filter(|(_, subs)| subs.iter().any(|s| s.tries > 1))
        .map(|(k, _)| k.as_str())
        .collect();
    let envelope = |rcpts: &[String]| -> BTreeSet<String> {
        rcpts
            .iter()
            .map(|r| r.trim_matches(['<', '>']).to_ascii_lowercase())
            .collect()
    };
    let window_ms = WINDOW.as_millis() as i64;
    let retry_limit_ms = (WINDOW - MARGIN + INTENT_SLACK).as_millis() as i64;
    let mut faulted: BTreeSet<&Unit> = BTreeSet::new();
    for (unit, (record, m)) in &stored {
        let Some(plan) = plan_of.get(unit.key.as_str()) else {
            continue;
        };
        let key = unit.key.as_str();
        let up = m.upstream_key.as_deref().unwrap_or_default();
        let txs = by_key.get(up).cloned().unwrap_or_default();
        if plan.fault != Fault::None
            || plan.shape == Shape::DifferentBytesTwice
            || txs.len() > 1
            || retried.contains(key)
        {
            faulted.insert(unit);
        }
        let attempts: Vec<AttemptRow> = reader.attempts(&record.id).await.unwrap();
        if attempts.len() > 1 {
            faulted.insert(unit);
        }
        if plan.fault != Fault::PastWindow {
            for pair in attempts.windows(2) {
                let gap = pair[1].started_at_ms - pair[0].started_at_ms;
                if gap > c.longest_gap_ms {
                    c.longest_gap_ms = gap;
                    let before = &pair[0];
                    c.longest_gap_unit = format!(
                        "{unit} before attempt {}, {:?}: attempt {} by {} ended {} at {} \
                         after {} ms",
                        pair[1].attempt,
                        plan.fault,
                        before.attempt,
                        before.owner,
                        before.outcome.as_deref().unwrap_or("open"),
                        before.phase.as_deref().unwrap_or("?"),
                        before
                            .finished_at_ms
                            .map_or(-1, |f| f - before.started_at_ms)
                    );
                }
            }
        }
        let unknowns = attempts
            .iter()
            .filter(|a| a.outcome.as_deref() == Some("unknown"))
            .count();
        c.unknown_attempts += unknowns;
        if let Some(open) = attempts.iter().find(|a| a.outcome.is_none()) {
            violations.push(format!("{unit}: intent left open: {open:?}"));
        }
        // Settled unresolved, whether an upstream event has resolved it since or not.
        let parked = record.state == State::Unresolved || m.resolved_by.is_some();
        if plan.fault != Fault::PastWindow && parked {
            c.parked_early += 1;
            // Not a violation (the relay may park what it cannot resolve in time), but worth
            // seeing: nothing else in this run should come near the window.
            eprintln!(
                "chaos {}: {unit} ({:?}) parked unresolved ({:?}); ledger: {attempts:#?}\n{}",
                scenario.name,
                plan.fault,
                record.upstream_reply,
                cluster.lines_about(&record.id)
            );
        }
        // Every reply was lost, so only the ledger's window could park it, and only the
        // sink's events (it did commit the message) can then resolve it.
        if plan.fault == Fault::PastWindow
            && (record.state != State::Delivered || m.resolved_by.is_none())
        {
            violations.push(format!(
                "{unit}: every reply was lost, yet the record is {:?} (resolved by {:?})",
                record.state, m.resolved_by
            ));
        }
        if plan.fault == Fault::PastWindow
            && attempts
                .iter()
                .any(|a| a.outcome.as_deref() == Some("accepted"))
        {
            violations.push(format!(
                "{unit}: every reply was lost, yet the ledger has an accepted attempt: \
                 {attempts:?}"
            ));
        }

        // What was stored is what its client sent (with the relay's lines), to the part's
        // recipients.
        let content = m.content.clone().unwrap_or_default();
        let ask = asks_of_id
            .get(record.id.as_str())
            .and_then(|asks| asks.first())
            .map(|(_, ask)| *ask);
        if let Some(ask) = ask {
            if !stored_as(&content, &message_bytes(plan, ask.variant), key, up) {
                violations.push(format!(
                    "{unit} ({}): the stored bytes are not those of {ask} under {up}",
                    record.id
                ));
            }
            if envelope(&m.rcpt_to) != envelope(&recipients(plan, ask.set)) {
                violations.push(format!(
                    "{unit} ({}): stored for {:?}, sent by {ask} to {:?}",
                    record.id,
                    m.rcpt_to,
                    recipients(plan, ask.set)
                ));
            }
        }

        // Byte identity: every transaction carried the stored bytes to the stored recipients,
        // and a losing variant never got out.
        for t in &txs {
            if t.bytes != content {
                c.mismatched_forwarded += 1;
                let which = ['a', 'b']
                    .into_iter()
                    .find(|v| {
                        let line = variant_line(key, *v);
                        t.bytes.windows(line.len()).any(|w| w == line.as_bytes())
                    })
                    .map_or("?".to_string(), |v| v.to_string());
                violations.push(format!(
                    "{unit}: transaction #{} forwarded bytes of variant {which} that differ from \
                     the stored record {}",
                    t.seq, record.id
                ));
            }
            if envelope(&t.rcpt_to) != envelope(&m.rcpt_to) {
                c.mismatched_forwarded += 1;
                violations.push(format!(
                    "{unit}: transaction #{} went to {:?}, the record {} is for {:?}",
                    t.seq, t.rcpt_to, record.id, m.rcpt_to
                ));
            }
        }

        // A transaction after the sink's first commit is the relay sending again what the
        // upstream already has: only an UNKNOWN attempt justifies that, and only inside the
        // window measured from the first attempt.
        let first_attempt = attempts.first().map(|a| a.started_at_ms);
        if txs.len() > attempts.len() {
            violations.push(format!(
                "{unit}: {} transactions but {} attempts in the ledger",
                txs.len(),
                attempts.len()
            ));
        }
        if let Some(commit) = txs.iter().position(|t| t.outcome == DotDecision::Accepted) {
            let extra = &txs[commit + 1..];
            c.extra_raw += extra.len();
            if !extra.is_empty() {
                let late = extra
                    .iter()
                    .any(|t| first_attempt.is_none_or(|f| t.received_at_ms as i64 > f + window_ms));
                if unknowns == 0 || late {
                    c.unexplained_extra += extra.len();
                    violations.push(format!(
                        "{unit}: {} raw transactions after the commit, {unknowns} UNKNOWN \
                         attempts, late {late}: {attempts:?}",
                        extra.len()
                    ));
                }
            }
        }
        if let (Some(first), Some(u)) = (
            first_attempt,
            attempts
                .iter()
                .position(|a| a.outcome.as_deref() == Some("unknown")),
        ) {
            for a in &attempts[u + 1..] {
                if a.started_at_ms > first + retry_limit_ms {
                    c.unknown_after_window += 1;
                    violations.push(format!(
                        "{unit}: attempt {} started {} ms after the first, past the window \
                         ({} ms) less the margin",
                        a.attempt,
                        a.started_at_ms - first,
                        (WINDOW - MARGIN).as_millis()
                    ));
                }
            }
        }
    }
    c.faulted_units = faulted.len();
    let hooks = check_webhooks(
        &scenario.store_url,
        reader.as_ref(),
        sink,
        &stored,
        &mut violations,
    )
    .await;

    // Per scope: units answered 250 / delivered.
    let mut per_scope: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for u in &answered {
        per_scope.entry(u.scope.as_str()).or_default().0 += 1;
    }
    for u in &delivered {
        per_scope.entry(u.scope.as_str()).or_default().1 += 1;
    }
    let later_parts = delivered.iter().filter(|u| u.part > 1).count();
    // A relay death nobody asked for (a panic, an exit) is always a breach.
    violations.extend(cluster.deaths.unexpected.iter().cloned());
    Audit {
        c,
        violations,
        hooks,
        per_scope: per_scope
            .into_iter()
            .map(|(scope, counts)| (scope.to_string(), counts))
            .collect(),
        later_parts,
    }
}
