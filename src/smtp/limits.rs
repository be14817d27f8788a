//! What one client may hold, as state without I/O: connection caps (global and per client)
//! and the slow-message rule (AUTH throttling is `auth::gate`'s). The server asks and obeys; every decision is here,
//! so tests drive it by hand (and by a clock passed in, where time matters).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::auth::throttle::client_key;

/// Open connections, in all and per client (by `client_key`), against their caps.
#[derive(Debug)]
struct ConnectionCounts {
    max_total: usize,
    max_per_client: usize,
    total: usize,
    /// Only clients with a connection open: an entry leaves at zero, so the map stays as
    /// small as the number of clients connected.
    per_client: HashMap<IpAddr, usize>,
}

impl ConnectionCounts {
    fn new(max_total: usize, max_per_client: usize) -> Self {
        ConnectionCounts {
            max_total,
            max_per_client,
            total: 0,
            per_client: HashMap::new(),
        }
    }

    /// Takes a place under the global cap; false (nothing taken) when it is full.
    fn open(&mut self) -> bool {
        if self.total >= self.max_total {
            return false;
        }
        self.total += 1;
        true
    }

    /// Counts an open place against `client`; false (nothing counted) at that client's cap.
    fn attribute(&mut self, client: IpAddr) -> bool {
        let n = self.per_client.get(&client).copied().unwrap_or(0);
        if n >= self.max_per_client {
            return false;
        }
        self.per_client.insert(client, n + 1);
        true
    }

    /// Gives back a place, and its client's count when it had one.
    fn close(&mut self, client: Option<IpAddr>) {
        self.total -= 1;
        let Some(client) = client else { return };
        if let Some(n) = self.per_client.get_mut(&client) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&client);
            }
        }
    }
}

/// Global and per-address connection caps, shared by all listeners.
pub(crate) struct ConnectionLimits {
    counts: Mutex<ConnectionCounts>,
}

/// One connection's place under the caps; given back when dropped.
pub(crate) struct ConnectionSlot<'a> {
    limits: &'a ConnectionLimits,
    /// The client it counts against; `None` while a proxied connection's client is unknown.
    ip: Option<IpAddr>,
}

impl ConnectionLimits {
    pub(crate) fn new(max_total: usize, max_per_ip: usize) -> Self {
        ConnectionLimits {
            counts: Mutex::new(ConnectionCounts::new(max_total, max_per_ip)),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, ConnectionCounts> {
        self.counts.lock().expect("connection counts")
    }

    /// Connections open now, on all listeners (for metrics).
    pub(crate) fn open_connections(&self) -> usize {
        self.counts().total
    }

    /// A slot under both caps, counted against `ip`.
    pub(crate) fn try_acquire(&self, ip: IpAddr) -> Option<ConnectionSlot<'_>> {
        let mut slot = self.try_acquire_unattributed()?;
        slot.attribute(ip).then_some(slot)
    }

    /// A slot under the global cap only, for a connection whose client is not known yet (a
    /// proxy's, before its PROXY header): counting it against the proxy's address would cap
    /// every client behind the proxy together.
    pub(crate) fn try_acquire_unattributed(&self) -> Option<ConnectionSlot<'_>> {
        // Built only once the place is taken: a slot dropped gives its place back.
        let opened = self.counts().open();
        opened.then(|| ConnectionSlot {
            limits: self,
            ip: None,
        })
    }
}

impl ConnectionSlot<'_> {
    /// Counts the slot against `ip`; false (and nothing counted) when that client is at its
    /// cap. A slot is attributed once.
    pub(crate) fn attribute(&mut self, ip: IpAddr) -> bool {
        debug_assert!(self.ip.is_none(), "a slot is attributed once");
        let ip = client_key(ip);
        let counted = self.limits.counts().attribute(ip);
        if counted {
            self.ip = Some(ip);
        }
        counted
    }
}

impl Drop for ConnectionSlot<'_> {
    fn drop(&mut self) {
        self.limits.counts().close(self.ip);
    }
}

/// How fast a message arrives, to drop slowloris clients: once `grace` has passed since its
/// first bytes, a message must have averaged at least `min_rate` bytes per second.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DataRate {
    since: Instant,
    bytes: u64,
}

impl DataRate {
    pub(crate) fn start(now: Instant) -> Self {
        DataRate {
            since: now,
            bytes: 0,
        }
    }

    /// Counts `n` more bytes of the message at `now`; true when it now arrives too slowly.
    pub(crate) fn record(
        &mut self,
        n: usize,
        now: Instant,
        min_rate: u64,
        grace: Duration,
    ) -> bool {
        self.bytes += n as u64;
        let elapsed = now.saturating_duration_since(self.since);
        elapsed > grace && (self.bytes as f64) < min_rate as f64 * elapsed.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn clients_are_counted_by_ipv4_address_or_ipv6_64() {
        let table = [
            ("192.0.2.1", "192.0.2.1"),
            ("::ffff:192.0.2.1", "192.0.2.1"),
            ("2001:db8::1", "2001:db8::"),
            ("2001:db8:0:0:ffff:ffff:ffff:ffff", "2001:db8::"),
            ("2001:db8:0:1::1", "2001:db8:0:1::"),
            ("::1", "::"),
        ];
        for (given, key) in table {
            assert_eq!(client_key(ip(given)), ip(key), "{given}");
        }
    }

    /// Each row: an operation on counts capped at 2 in all and 1 per client, whether it is
    /// granted, and the totals after it.
    #[test]
    fn counts_hold_both_caps_and_give_back_what_was_taken() {
        #[derive(Debug, Clone, Copy)]
        enum Op {
            Open,
            Attribute(&'static str),
            Close(Option<&'static str>),
        }
        use Op::*;
        /// Clients and their counts.
        type Counts = &'static [(&'static str, usize)];
        let table: &[(Op, bool, usize, Counts)] = &[
            (Open, true, 1, &[]),
            (Attribute("192.0.2.1"), true, 1, &[("192.0.2.1", 1)]),
            (Open, true, 2, &[("192.0.2.1", 1)]),
            // The same client again: over its cap, nothing counted.
            (Attribute("192.0.2.1"), false, 2, &[("192.0.2.1", 1)]),
            // The global cap counts unattributed places too.
            (Open, false, 2, &[("192.0.2.1", 1)]),
            (
                Attribute("192.0.2.2"),
                true,
                2,
                &[("192.0.2.1", 1), ("192.0.2.2", 1)],
            ),
            (Close(Some("192.0.2.1")), true, 1, &[("192.0.2.2", 1)]),
            (Close(Some("192.0.2.2")), true, 0, &[]),
            (Open, true, 1, &[]),
            (Close(None), true, 0, &[]),
        ];
        let mut counts = ConnectionCounts::new(2, 1);
        for (row, &(op, granted, total, per_client)) in table.iter().enumerate() {
            let got = match op {
                Open => counts.open(),
                Attribute(client) => counts.attribute(ip(client)),
                Close(client) => {
                    counts.close(client.map(ip));
                    true
                }
            };
            assert_eq!(got, granted, "row {row}: {op:?}");
            assert_eq!(counts.total, total, "row {row}: {op:?}");
            let want: HashMap<IpAddr, usize> =
                per_client.iter().map(|&(c, n)| (ip(c), n)).collect();
            assert_eq!(counts.per_client, want, "row {row}: {op:?}");
        }
    }

    #[test]
    fn a_per_client_cap_of_zero_refuses_and_keeps_no_entry() {
        let mut counts = ConnectionCounts::new(5, 0);
        assert!(counts.open());
        assert!(!counts.attribute(ip("192.0.2.1")));
        assert!(counts.per_client.is_empty());
    }

    /// A proxy's connection holds a global slot until its header names the client, then
    /// counts against that client; every way out gives back exactly what was taken.
    #[test]
    fn slots_are_attributed_once_and_never_leak() {
        let limits = ConnectionLimits::new(3, 1);
        let mut a = limits.try_acquire_unattributed().unwrap();
        let mut b = limits.try_acquire_unattributed().unwrap();
        assert_eq!(limits.open_connections(), 2);
        assert!(a.attribute(ip("192.0.2.1")));
        // The same client again is over its cap; the slot stays global-only.
        assert!(!b.attribute(ip("192.0.2.1")));
        assert!(limits.try_acquire(ip("192.0.2.1")).is_none());
        assert!(b.attribute(ip("192.0.2.2")));
        let c = limits.try_acquire(ip("127.0.0.1")).unwrap();
        // The global cap holds unattributed slots too.
        assert!(limits.try_acquire_unattributed().is_none());
        drop((a, b, c));
        assert_eq!(limits.open_connections(), 0);
        assert!(limits.counts().per_client.is_empty());
        // An IPv6 client counts by its /64.
        let d = limits.try_acquire(ip("2001:db8::1")).unwrap();
        assert!(limits.try_acquire(ip("2001:db8::2")).is_none());
        drop(d);
        let mut e = limits.try_acquire_unattributed().unwrap();
        assert!(!{
            let _f = limits.try_acquire(ip("2001:db8::3")).unwrap();
            e.attribute(ip("2001:db8::4"))
        });
        drop(e);
        assert_eq!(limits.open_connections(), 0);
        assert!(limits.counts().per_client.is_empty());
    }

    /// Each row: (grace, minimum rate, [(seconds since the first bytes, bytes read then)],
    /// whether the last read finds the message too slow).
    #[test]
    fn a_message_must_keep_up_the_minimum_rate_after_the_grace() {
        let secs = Duration::from_secs;
        /// (seconds since the first bytes, bytes read then), in order.
        type Reads = &'static [(u64, usize)];
        let table: &[(Duration, u64, Reads, bool)] = &[
            // Inside the grace, however slow.
            (secs(10), 100, &[(0, 1), (10, 1)], false),
            // Past the grace, under the average.
            (secs(10), 100, &[(0, 1), (11, 1)], true),
            // Past the grace, on the average exactly: not under it.
            (secs(10), 100, &[(0, 600), (11, 500)], false),
            (secs(10), 100, &[(0, 600), (11, 499)], true),
            // A burst late makes up for a slow start.
            (secs(5), 10, &[(0, 1), (4, 1), (20, 198)], false),
            // A minimum of zero never cuts.
            (secs(0), 0, &[(0, 0), (3600, 0)], false),
        ];
        let start = Instant::now();
        for (row, &(grace, min_rate, reads, slow)) in table.iter().enumerate() {
            let mut rate = DataRate::start(start);
            let mut last = false;
            for &(at, n) in reads {
                last = rate.record(n, start + secs(at), min_rate, grace);
            }
            assert_eq!(last, slow, "row {row}");
        }
    }
}
