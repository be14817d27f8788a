//! Printing figures and checking them against the targets.

use std::time::Duration;

use crate::load::Measured;

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

pub fn mb(kib: u64) -> String {
    format!("{:.1} MB", kib as f64 / 1024.0)
}

/// Microseconds of `cpu` per message of `messages`.
pub fn per_message(cpu: Option<Duration>, messages: usize) -> String {
    cpu.map_or("?".into(), |t| {
        format!("{:.0} µs", t.as_secs_f64() * 1e6 / messages.max(1) as f64)
    })
}

pub struct Report {
    pub failures: Vec<String>,
}

impl Report {
    pub fn ratio(
        &mut self,
        what: &str,
        relay: f64,
        sink: f64,
        target: f64,
        higher_is_better: bool,
    ) {
        self.ratio_of(what, "relay/sink", relay / sink, target, higher_is_better);
    }

    /// `ratio` (named `name`) against `target`.
    pub fn ratio_of(
        &mut self,
        what: &str,
        name: &str,
        ratio: f64,
        target: f64,
        higher_is_better: bool,
    ) {
        let ok = if higher_is_better {
            ratio >= target
        } else {
            ratio <= target
        };
        let sign = if higher_is_better { ">=" } else { "<=" };
        println!(
            "  => {what}: {name} = {ratio:.2} (target {sign} {target:.2}) {}",
            if ok { "PASS" } else { "MISS" }
        );
        if !ok {
            self.failures.push(format!("{what}: {ratio:.2}"));
        }
    }

    /// The relay's peak RSS against its bound (docs/contributing/performance.md).
    pub fn rss(&mut self, what: &str, kib: Option<u64>) {
        match kib {
            Some(kib) if kib <= 64 * 1024 => {
                println!("  => {what} peak RSS {} <= 64 MB PASS", mb(kib))
            }
            Some(kib) => {
                println!("  => {what} peak RSS {} <= 64 MB MISS", mb(kib));
                self.failures.push(format!("{what} RSS {}", mb(kib)));
            }
            None => println!("  => {what} peak RSS not readable"),
        }
    }
}

pub fn line(name: &str, m: &Measured) {
    println!(
        "  {name:<6} {:>8.0} msg/s   p50 {:>9}   p99 {:>9}   ({:.2} s)",
        m.per_second,
        ms(m.p50),
        ms(m.p99),
        m.elapsed.as_secs_f64()
    );
}

/// The median of each figure over the rounds.
pub fn median(runs: &[Measured]) -> Measured {
    fn mid<T: Copy + PartialOrd>(mut v: Vec<T>) -> T {
        v.sort_by(|a, b| a.partial_cmp(b).expect("comparable"));
        v[v.len() / 2]
    }
    Measured {
        per_second: mid(runs.iter().map(|m| m.per_second).collect()),
        p50: mid(runs.iter().map(|m| m.p50).collect()),
        p99: mid(runs.iter().map(|m| m.p99).collect()),
        elapsed: mid(runs.iter().map(|m| m.elapsed).collect()),
        per_server: Vec::new(),
    }
}

pub fn median_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("comparable"));
    v[v.len() / 2]
}
