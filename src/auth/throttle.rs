//! AUTH failure throttling (docs/guides/tls-auth-relay.md): counts per (client, user name), with a looser cap per
//! client across all names.
//!
//! Pure bookkeeping, no I/O and no clock of its own: every call takes `now`, so tests drive
//! time by hand. The caller holds it behind a lock and passes the client's grouping key (the
//! SMTP server passes `client_key`: the IPv4 address, or the IPv6 /64).
//!
//! Rules:
//! - Each failed AUTH adds one to the count of its (client, name) pair and one to the count of
//!   its client. A pair at `per_user` failures, or a client at `per_address` failures, is
//!   refused at AUTH (before any password check) — so one program with a wrong password locks
//!   out its own name only, while a client cycling through names is still stopped.
//! - A count is forgotten once `window` passes without a new failure for it. Refused attempts
//!   are not failures (no password was checked), so a lockout lasts `window` after the last
//!   real failure, however often the client retries meanwhile.
//! - A successful AUTH clears its pair, and takes that pair's failures off its client's count
//!   too: they were the typos of a user who then got in, not guesses at other names.
//! - Names are compared exactly as given, case included, as the users file looks them up
//!   (`Alice` is not `alice`, and is an unknown user). Unknown users count like known ones.
//!   A name no user can have (see `name_ok`: empty, over 64 characters, other characters) is
//!   counted under one shared "invalid name" pair per client, so an entry never holds more
//!   than a valid name's 64 bytes.
//! - Memory is bounded: each table holds at most `max_entries` entries. When a new entry does
//!   not fit, expired ones are dropped and, if that is not enough, the oldest eighth (by last
//!   failure) is evicted.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Entries each table holds at most, by default.
pub(crate) const DEFAULT_MAX_ENTRIES: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ThrottleLimits {
    /// Failures of one (client, name) pair before that name is refused from that client.
    pub per_user: u32,
    /// Failures of one client across all names before every AUTH from it is refused.
    pub per_address: u32,
    /// How long a count lasts without a new failure.
    pub window: Duration,
    /// Entries per table (pairs, clients) at most.
    pub max_entries: usize,
}

/// What [`AuthFailures::check`] decides for an AUTH attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Check the password.
    Allowed,
    /// This name has failed too often from this client.
    UserLocked,
    /// This client has failed too often, across names.
    AddressLocked,
}

/// A user name as counted: the name itself when a user could have it, else one shared key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct NameKey(Option<Box<str>>);

impl NameKey {
    fn of(name: &str) -> NameKey {
        NameKey(super::users::name_ok(name).then(|| name.into()))
    }
}

#[derive(Debug, Clone, Copy)]
struct Count {
    failures: u32,
    last_failure: Instant,
}

impl Count {
    fn live(&self, now: Instant, window: Duration) -> bool {
        now.saturating_duration_since(self.last_failure) < window
    }
}

/// The failure counts; see the module documentation for the rules.
#[derive(Debug)]
pub(crate) struct AuthFailures {
    limits: ThrottleLimits,
    pairs: HashMap<(IpAddr, NameKey), Count>,
    addresses: HashMap<IpAddr, Count>,
}

impl AuthFailures {
    pub(crate) fn new(limits: ThrottleLimits) -> AuthFailures {
        AuthFailures {
            limits: ThrottleLimits {
                max_entries: limits.max_entries.max(1),
                ..limits
            },
            pairs: HashMap::new(),
            addresses: HashMap::new(),
        }
    }

    /// Whether `client` may try a password for `user` now.
    pub(crate) fn check(&self, client: IpAddr, user: &str, now: Instant) -> Verdict {
        let window = self.limits.window;
        let failures = |count: Option<&Count>| {
            count
                .filter(|c| c.live(now, window))
                .map_or(0, |c| c.failures)
        };
        if failures(self.addresses.get(&client)) >= self.limits.per_address {
            Verdict::AddressLocked
        } else if failures(self.pairs.get(&(client, NameKey::of(user)))) >= self.limits.per_user {
            Verdict::UserLocked
        } else {
            Verdict::Allowed
        }
    }

    /// A password check for `user` from `client` failed (unknown users included).
    pub(crate) fn record_failure(&mut self, client: IpAddr, user: &str, now: Instant) {
        let limits = self.limits;
        bump(&mut self.pairs, (client, NameKey::of(user)), now, limits);
        bump(&mut self.addresses, client, now, limits);
    }

    /// `user` authenticated from `client`: its pair starts over, and the client's count loses
    /// the pair's failures.
    pub(crate) fn record_success(&mut self, client: IpAddr, user: &str, now: Instant) {
        let window = self.limits.window;
        let Some(pair) = self.pairs.remove(&(client, NameKey::of(user))) else {
            return;
        };
        if !pair.live(now, window) {
            return;
        }
        if let Some(address) = self.addresses.get_mut(&client) {
            address.failures = address.failures.saturating_sub(pair.failures);
            if address.failures == 0 {
                self.addresses.remove(&client);
            }
        }
    }

    #[cfg(test)]
    /// Entries held now: (pairs, clients).
    pub(crate) fn tracked(&self) -> (usize, usize) {
        (self.pairs.len(), self.addresses.len())
    }
}

/// One more failure for `key`, making room first if `key` is new and the table is full.
fn bump<K: Hash + Eq>(table: &mut HashMap<K, Count>, key: K, now: Instant, limits: ThrottleLimits) {
    if !table.contains_key(&key) && table.len() >= limits.max_entries {
        make_room(table, now, limits);
    }
    let count = table.entry(key).or_insert(Count {
        failures: 0,
        last_failure: now,
    });
    if !count.live(now, limits.window) {
        count.failures = 0;
    }
    count.failures = count.failures.saturating_add(1);
    count.last_failure = count.last_failure.max(now);
}

/// Drops expired entries; if the table is still full, the oldest eighth (at least one).
fn make_room<K: Hash + Eq>(table: &mut HashMap<K, Count>, now: Instant, limits: ThrottleLimits) {
    table.retain(|_, count| count.live(now, limits.window));
    if table.len() < limits.max_entries {
        return;
    }
    let mut times: Vec<Instant> = table.values().map(|c| c.last_failure).collect();
    let evict = (times.len() / 8).max(1);
    let (_, cutoff, _) = times.select_nth_unstable(evict - 1);
    let cutoff = *cutoff;
    // Exactly `evict` entries go: all older than the cutoff, and as many as needed of those
    // at it (entries made at the same instant must not all go at once).
    let older = times.iter().filter(|t| **t < cutoff).count();
    let mut at_cutoff = evict - older;
    table.retain(|_, count| {
        if count.last_failure < cutoff {
            false
        } else if count.last_failure == cutoff && at_cutoff > 0 {
            at_cutoff -= 1;
            false
        } else {
            true
        }
    });
}

/// The unit a client is counted by: its IPv4 address, or its IPv6 /64 (one host commonly has
/// a whole /64 to pick addresses from).
pub(crate) fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn limits() -> ThrottleLimits {
        ThrottleLimits {
            per_user: 3,
            per_address: 5,
            window: 15 * MIN,
            max_entries: 1000,
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// One step of a scenario: at `at` after the start, from `client` as `user`, the check
    /// says `expect`, then the attempt `fails` (true), succeeds (false), or is not made
    /// (`None`, e.g. because it was refused).
    type Step = (Duration, &'static str, &'static str, Verdict, Option<bool>);

    fn run(name: &str, limits: ThrottleLimits, steps: &[Step]) {
        let start = Instant::now();
        let mut throttle = AuthFailures::new(limits);
        for (i, (at, client, user, expect, outcome)) in steps.iter().enumerate() {
            let now = start + *at;
            let client = ip(client);
            assert_eq!(
                throttle.check(client, user, now),
                *expect,
                "{name}: step {i} ({user} from {client} at {at:?})"
            );
            match outcome {
                Some(true) => throttle.record_failure(client, user, now),
                Some(false) => throttle.record_success(client, user, now),
                None => {}
            }
        }
    }

    const A: &str = "127.0.0.1";
    const B: &str = "192.0.2.7";
    const S: Duration = Duration::from_secs(1);
    use Verdict::{AddressLocked as Addr, Allowed as Ok_, UserLocked as User};

    #[test]
    fn scenarios() {
        let fail = Some(true);
        let succeed = Some(false);
        let cases: Vec<(&str, Vec<Step>)> = vec![
            (
                "a locked-out name does not lock out another name on the same client",
                vec![
                    (S, A, "alice", Ok_, fail),
                    (2 * S, A, "alice", Ok_, fail),
                    (3 * S, A, "alice", Ok_, fail),
                    (4 * S, A, "alice", User, None),
                    (5 * S, A, "bob", Ok_, succeed),
                    (6 * S, A, "bob", Ok_, succeed),
                    (7 * S, A, "alice", User, None),
                ],
            ),
            (
                "the same name from another client is not locked",
                vec![
                    (S, A, "alice", Ok_, fail),
                    (S, A, "alice", Ok_, fail),
                    (S, A, "alice", Ok_, fail),
                    (S, A, "alice", User, None),
                    (S, B, "alice", Ok_, succeed),
                ],
            ),
            (
                "cycling through names is stopped by the per-client cap, for every name",
                vec![
                    (S, A, "u1", Ok_, fail),
                    (S, A, "u2", Ok_, fail),
                    (S, A, "u3", Ok_, fail),
                    (S, A, "u4", Ok_, fail),
                    (S, A, "u5", Ok_, fail),
                    (S, A, "u6", Addr, None),
                    (S, A, "bob", Addr, None),
                    (S, B, "u6", Ok_, fail),
                ],
            ),
            (
                "the client cap is checked before the name's own count",
                vec![
                    (S, A, "u1", Ok_, fail),
                    (S, A, "u1", Ok_, fail),
                    (S, A, "u2", Ok_, fail),
                    (S, A, "u2", Ok_, fail),
                    (S, A, "u1", Ok_, fail),
                    (S, A, "u1", Addr, None),
                ],
            ),
            (
                "a success clears its pair and takes its failures off the client's count",
                vec![
                    (S, A, "alice", Ok_, fail),
                    (S, A, "alice", Ok_, fail),
                    (S, A, "alice", Ok_, succeed),
                    (S, A, "alice", Ok_, fail),
                    (S, A, "alice", Ok_, fail),
                    (S, A, "u1", Ok_, fail),
                    (S, A, "u2", Ok_, fail),
                    (S, A, "u3", Ok_, fail),
                    // 2 (alice) + 3 = 5: the client is at its cap.
                    (S, A, "u4", Addr, None),
                ],
            ),
            (
                "a success for one name does not clear another",
                vec![
                    (S, A, "alice", Ok_, fail),
                    (S, A, "alice", Ok_, fail),
                    (S, A, "bob", Ok_, succeed),
                    (S, A, "alice", Ok_, fail),
                    (S, A, "alice", User, None),
                ],
            ),
            (
                "a lockout ends one window after the last failure; refusals do not extend it",
                vec![
                    (S, A, "alice", Ok_, fail),
                    (2 * S, A, "alice", Ok_, fail),
                    (3 * S, A, "alice", Ok_, fail),
                    (10 * MIN, A, "alice", User, None),
                    (15 * MIN + 2 * S, A, "alice", User, None),
                    (15 * MIN + 3 * S, A, "alice", Ok_, fail),
                    // A fresh count: one failure so far.
                    (15 * MIN + 4 * S, A, "alice", Ok_, fail),
                    (15 * MIN + 5 * S, A, "alice", Ok_, fail),
                    (15 * MIN + 6 * S, A, "alice", User, None),
                ],
            ),
            (
                "failures less than a window apart add up",
                vec![
                    (Duration::ZERO, A, "alice", Ok_, fail),
                    (14 * MIN, A, "alice", Ok_, fail),
                    (28 * MIN, A, "alice", Ok_, fail),
                    (42 * MIN, A, "alice", User, None),
                ],
            ),
            (
                "names are compared as given: case matters",
                vec![
                    (S, A, "alice", Ok_, fail),
                    (S, A, "alice", Ok_, fail),
                    (S, A, "alice", Ok_, fail),
                    (S, A, "Alice", Ok_, fail),
                    (S, A, "alice", User, None),
                ],
            ),
            (
                "names no user can have share one count",
                vec![
                    (S, A, "", Ok_, fail),
                    (S, A, "has space", Ok_, fail),
                    (S, A, "x\u{e9}", Ok_, fail),
                    (S, A, "z z", User, None),
                    (S, A, "valid.name", Ok_, fail),
                ],
            ),
        ];
        for (name, steps) in cases {
            run(name, limits(), &steps);
        }
    }

    #[test]
    fn ipv6_and_ipv4_clients_are_separate_keys() {
        let mut t = AuthFailures::new(limits());
        let now = Instant::now();
        for _ in 0..3 {
            t.record_failure(ip("::1"), "alice", now);
        }
        assert_eq!(t.check(ip("::1"), "alice", now), Verdict::UserLocked);
        assert_eq!(t.check(ip(A), "alice", now), Verdict::Allowed);
    }

    #[test]
    fn memory_is_bounded_and_the_oldest_go_first() {
        let limits = ThrottleLimits {
            max_entries: 16,
            ..limits()
        };
        let start = Instant::now();
        let mut t = AuthFailures::new(limits);
        // 200 clients, one name each, 10 ms apart: the table fills and keeps evicting.
        let at = |i: u32| start + Duration::from_millis(u64::from(i) * 10);
        for i in 0..200u32 {
            let client = IpAddr::from([10, 0, (i >> 8) as u8, i as u8]);
            t.record_failure(client, &format!("user{i}"), at(i));
            let (pairs, clients) = t.tracked();
            assert!(
                pairs <= 16 && clients <= 16,
                "{pairs} pairs, {clients} clients"
            );
            // Eviction takes an eighth, not everything.
            assert!(pairs >= (i as usize + 1).min(14), "{pairs} pairs after {i}");
        }
        let at = at(199);
        // The newest entries survive eviction, the oldest are gone.
        let newest = IpAddr::from([10, 0, 0, 199]);
        let oldest = IpAddr::from([10, 0, 0, 0]);
        assert!(t.pairs.contains_key(&(newest, NameKey::of("user199"))));
        assert!(!t.pairs.contains_key(&(oldest, NameKey::of("user0"))));
        // A locked pair survives while newer than what is evicted.
        for _ in 0..3 {
            t.record_failure(newest, "user199", at);
        }
        t.record_failure(IpAddr::from([10, 9, 9, 9]), "x", at + S);
        assert_eq!(t.check(newest, "user199", at + S), Verdict::UserLocked);
    }

    #[test]
    fn entries_made_at_one_instant_are_evicted_an_eighth_at_a_time() {
        let limits = ThrottleLimits {
            max_entries: 16,
            ..limits()
        };
        let now = Instant::now();
        let mut t = AuthFailures::new(limits);
        for i in 0..17u8 {
            t.record_failure(IpAddr::from([10, 0, 0, i]), "same", now);
        }
        assert_eq!(t.tracked(), (15, 15));
    }

    #[test]
    fn expired_entries_are_dropped_before_live_ones_are_evicted() {
        let limits = ThrottleLimits {
            max_entries: 4,
            ..limits()
        };
        let start = Instant::now();
        let mut t = AuthFailures::new(limits);
        for _ in 0..3 {
            t.record_failure(ip(A), "alice", start + 10 * MIN);
        }
        for i in 0..3u8 {
            t.record_failure(IpAddr::from([10, 0, 0, i]), "old", start);
        }
        assert_eq!(t.tracked(), (4, 4));
        // At 16 minutes the three old entries have expired; alice's (at 10 minutes) has not.
        let now = start + 16 * MIN;
        t.record_failure(ip(B), "bob", now);
        assert_eq!(t.tracked(), (2, 2));
        assert_eq!(t.check(ip(A), "alice", now), Verdict::UserLocked);
    }

    #[test]
    fn a_clock_that_goes_back_does_not_panic_or_unlock() {
        let start = Instant::now() + MIN;
        let mut t = AuthFailures::new(limits());
        for _ in 0..3 {
            t.record_failure(ip(A), "alice", start);
        }
        let earlier = start - S;
        assert_eq!(t.check(ip(A), "alice", earlier), Verdict::UserLocked);
        t.record_failure(ip(A), "alice", earlier);
        t.record_success(ip(A), "bob", earlier);
        assert_eq!(t.check(ip(A), "alice", start), Verdict::UserLocked);
    }
}
