use super::*;
use BreakerState::*;

const COOL: Duration = Duration::from_secs(30);

fn at(t0: Instant, secs: u64) -> Instant {
    t0 + Duration::from_secs(secs)
}

fn policy(threshold: u32) -> BreakerPolicy {
    BreakerPolicy {
        threshold,
        cooldown: COOL,
        window: Duration::from_secs(60),
        window_messages: 3,
        window_ratio: 0.75,
    }
}

const DOWN: BreakerInput = BreakerInput::Unwell(Unwell::Connect);
const BUSY: BreakerInput = BreakerInput::MessageFailure;
const OK: BreakerInput = BreakerInput::Success;
const FIVE: BreakerInput = BreakerInput::Neutral;

#[derive(Debug, Clone, Copy)]
enum Step {
    /// `admit` at t of message `id`, which has (true) or has not failed before.
    Ask(u64, &'static str, bool, Admit),
    /// An attempt of `id` to `id`'s own recipients ended at t.
    Ended(u64, &'static str, BreakerInput),
    /// An attempt of `id` to recipients `to`.
    EndedTo(u64, &'static str, &'static str, BreakerInput),
    /// A connection check ended at t.
    Checked(u64, BreakerInput),
    State(u64, BreakerState),
    /// Why it is open or half-open, by the log line's class.
    Class(Option<&'static str>),
    /// `transition` at t: the state entered since the last call, if any.
    Moved(u64, Option<BreakerState>),
}
use Step::*;

const WAIT_PROBE: Admit = Admit::Wait(PROBE_WAIT);

fn wait(secs: u64) -> Admit {
    Admit::Wait(Duration::from_secs(secs))
}

fn run(name: &str, policy: BreakerPolicy, steps: &[Step]) {
    let t0 = Instant::now();
    let mut b = Breaker::new(policy);
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Ask(t, id, failed_before, want) => assert_eq!(
                b.admit(at(t0, t), Candidate { id, failed_before }),
                want,
                "{name}: step {i} {step:?}"
            ),
            Ended(t, id, input) => b.on_attempt(at(t0, t), Attempted { id, to: id }, input),
            EndedTo(t, id, to, input) => b.on_attempt(at(t0, t), Attempted { id, to }, input),
            Checked(t, input) => b.on_check(at(t0, t), input),
            State(t, want) => assert_eq!(b.state(at(t0, t)), want, "{name}: step {i} {step:?}"),
            Class(want) => assert_eq!(b.why().map(Why::class), want, "{name}: step {i}"),
            Moved(t, want) => {
                assert_eq!(
                    b.transition(at(t0, t)).map(|moved| moved.to),
                    want,
                    "{name}: step {i} {step:?}"
                )
            }
        }
    }
}

#[test]
fn names() {
    assert_eq!(Closed.as_str(), "closed");
    assert_eq!(Open.as_str(), "open");
    assert_eq!(HalfOpen.as_str(), "half_open");
}

#[test]
fn scenarios() {
    let table: &[(&str, u32, &[Step])] = &[
        (
            "fresh breaker is closed",
            3,
            &[
                State(0, Closed),
                Ask(0, "a", false, Admit::Send),
                Ask(0, "b", true, Admit::Send),
            ],
        ),
        (
            "opens at the threshold of upstream failures, not before, and says why",
            3,
            &[
                Ended(0, "a", DOWN),
                Ended(1, "b", DOWN),
                State(1, Closed),
                Ask(1, "c", false, Admit::Send),
                Ended(2, "c", BreakerInput::Unwell(Unwell::Greeting)),
                State(2, Open),
                Class(Some("greeting")),
                Ask(2, "d", false, wait(30)),
                Ask(12, "d", false, wait(20)),
            ],
        ),
        (
            "the operator's case: a busy mailbox and dropped dot replies never open it",
            2,
            &[
                EndedTo(0, "m1", "busy@", BUSY),
                EndedTo(0, "m2", "busy@", BUSY),
                EndedTo(0, "m3", "busy@", BUSY),
                EndedTo(0, "m4", "busy@", BUSY),
                EndedTo(1, "m5", "lost@", BUSY),
                EndedTo(1, "m6", "lost@", BUSY),
                EndedTo(2, "m1", "busy@", BUSY),
                EndedTo(2, "m5", "lost@", BUSY),
                EndedTo(3, "m2", "busy@", BUSY),
                State(3, Closed),
                Ask(3, "healthy", false, Admit::Send),
            ],
        ),
        (
            "a message failing on its own ends a run of upstream failures",
            2,
            &[
                Ended(0, "a", DOWN),
                Ended(1, "b", BUSY),
                Ended(2, "c", DOWN),
                State(2, Closed),
            ],
        ),
        (
            "a success or a 5xx in between resets the run",
            2,
            &[
                Ended(0, "a", DOWN),
                Ended(1, "b", OK),
                Ended(2, "a", DOWN),
                Ended(3, "c", FIVE),
                Ended(4, "a", DOWN),
                State(4, Closed),
                Ended(5, "a", DOWN),
                State(5, Open),
            ],
        ),
        (
            "many different messages failing on their own open it",
            99,
            &[
                Ended(0, "a", BUSY),
                Ended(1, "b", BUSY),
                State(1, Closed),
                Ended(2, "c", BUSY),
                State(2, Open),
                Class(Some("messages")),
            ],
        ),
        (
            "...not when they are few among many healthy ones",
            99,
            &[
                Ended(0, "ok1", OK),
                Ended(0, "ok2", OK),
                Ended(1, "a", BUSY),
                Ended(1, "b", BUSY),
                Ended(2, "c", BUSY),
                State(2, Closed),
                // 3 of 5 is under 0.75, and so are 5 of 7.
                Ended(3, "d", BUSY),
                Ended(3, "e", BUSY),
                State(3, Closed),
                // The healthy ones age out of the window: 5 of 5.
                Ended(61, "e", BUSY),
                State(61, Open),
            ],
        ),
        (
            "...not when one message keeps failing, nor many to the same recipients",
            99,
            &[
                Ended(0, "a", BUSY),
                Ended(1, "a", BUSY),
                Ended(2, "a", BUSY),
                EndedTo(3, "b", "a", BUSY),
                EndedTo(3, "c", "a", BUSY),
                Ended(4, "d", BUSY),
                State(4, Closed),
            ],
        ),
        (
            "...and a message that then goes through no longer counts as failing",
            99,
            &[
                Ended(0, "a", BUSY),
                Ended(1, "b", BUSY),
                Ended(2, "a", OK),
                Ended(3, "c", BUSY),
                State(3, Closed),
                Ended(4, "d", BUSY),
                State(4, Open),
            ],
        ),
        (
            "stays open for the cooldown, then admits exactly one probe",
            1,
            &[
                Ended(10, "a", DOWN),
                Ask(39, "b", false, wait(1)),
                State(39, Open),
                State(40, HalfOpen),
                Ask(40, "b", false, Admit::Probe),
                Ask(40, "c", false, WAIT_PROBE),
                Ask(41, "a", true, WAIT_PROBE),
                State(41, HalfOpen),
            ],
        ),
        (
            "a message that failed before is not the probe: the connection is checked",
            1,
            &[
                Ended(0, "a", DOWN),
                Ask(30, "a", true, Admit::CheckConnection),
                Ask(30, "b", false, WAIT_PROBE),
                Checked(31, OK),
                State(31, Closed),
                Ask(31, "a", true, Admit::Send),
            ],
        ),
        (
            "a failed connection check reopens with a fresh cooldown and its class",
            1,
            &[
                Ended(0, "a", DOWN),
                Ask(30, "a", true, Admit::CheckConnection),
                Checked(31, BreakerInput::Unwell(Unwell::Tls)),
                State(31, Open),
                Class(Some("tls")),
                Ask(60, "a", true, wait(1)),
                Ask(61, "b", false, Admit::Probe),
            ],
        ),
        (
            "a check refused at MAIL FROM:<> still shows the upstream answering",
            1,
            &[
                Ended(0, "a", DOWN),
                Ask(30, "a", true, Admit::CheckConnection),
                Checked(31, BUSY),
                State(31, Closed),
            ],
        ),
        (
            "a check result while no check is under way changes nothing",
            1,
            &[
                Ended(0, "a", DOWN),
                Checked(1, OK),
                State(1, Open),
                Ask(30, "b", false, Admit::Probe),
                Checked(31, OK),
                Checked(31, DOWN),
                State(31, HalfOpen),
            ],
        ),
        (
            "successful probe closes",
            1,
            &[
                Ended(0, "a", DOWN),
                Ask(30, "b", false, Admit::Probe),
                Ended(30, "b", OK),
                State(30, Closed),
                Ask(30, "a", true, Admit::Send),
            ],
        ),
        (
            "a 5xx probe closes",
            1,
            &[
                Ended(0, "a", DOWN),
                Ask(30, "b", false, Admit::Probe),
                Ended(30, "b", FIVE),
                State(30, Closed),
            ],
        ),
        (
            "opened for an unwell upstream, a probe failing on its own shows the session works",
            1,
            &[
                Ended(0, "a", DOWN),
                Ask(30, "b", false, Admit::Probe),
                Ended(31, "b", BUSY),
                State(31, Closed),
            ],
        ),
        (
            "opened for failing messages, a fresh probe failing too reopens",
            99,
            &[
                Ended(0, "a", BUSY),
                Ended(0, "b", BUSY),
                Ended(0, "c", BUSY),
                Ask(30, "d", false, Admit::Probe),
                Ended(31, "d", BUSY),
                State(31, Open),
                Class(Some("messages")),
                Ask(61, "e", false, Admit::Probe),
                Ended(62, "e", OK),
                State(62, Closed),
            ],
        ),
        (
            "a failed probe reopens with a fresh cooldown",
            3,
            &[
                Ended(0, "a", DOWN),
                Ended(0, "a", DOWN),
                Ended(0, "a", DOWN),
                Ask(30, "b", false, Admit::Probe),
                Ended(35, "b", DOWN),
                State(35, Open),
                Ask(64, "c", false, wait(1)),
                Ask(65, "c", false, Admit::Probe),
                Ask(65, "d", false, WAIT_PROBE),
            ],
        ),
        (
            "late failures of other messages decide nothing in half-open",
            1,
            &[
                Ended(0, "a", DOWN),
                Ask(30, "b", false, Admit::Probe),
                Ended(31, "x", DOWN),
                Ended(31, "y", BUSY),
                State(31, HalfOpen),
                Ended(32, "b", OK),
                State(32, Closed),
            ],
        ),
        (
            "late failures while open do not extend the cooldown",
            1,
            &[
                Ended(0, "a", DOWN),
                Ended(20, "b", DOWN),
                Ended(29, "c", BUSY),
                Ask(30, "d", false, Admit::Probe),
            ],
        ),
        (
            "late success while open closes",
            1,
            &[
                Ended(0, "a", DOWN),
                Ended(1, "b", OK),
                State(1, Closed),
                Ask(1, "a", true, Admit::Send),
            ],
        ),
        (
            "a lost probe is given up after a cooldown",
            1,
            &[
                Ended(0, "a", DOWN),
                Ask(30, "b", false, Admit::Probe),
                Ask(59, "c", false, WAIT_PROBE),
                Ask(60, "a", true, Admit::CheckConnection),
                Ask(60, "c", false, WAIT_PROBE),
                // The first probe's late answer no longer decides.
                Ended(61, "b", DOWN),
                State(61, HalfOpen),
            ],
        ),
        (
            "threshold 0 behaves as 1",
            0,
            &[
                State(0, Closed),
                Ask(0, "a", false, Admit::Send),
                Ended(0, "a", DOWN),
                State(0, Open),
                Ask(0, "a", true, wait(30)),
            ],
        ),
        (
            "each change is reported once: closed, open, half-open, closed",
            2,
            &[
                Moved(0, None),
                Ended(0, "a", DOWN),
                Moved(0, None),
                Ended(1, "a", DOWN),
                Moved(1, Some(Open)),
                Moved(2, None),
                Ask(31, "a", true, Admit::CheckConnection),
                Moved(31, Some(HalfOpen)),
                Moved(31, None),
                Checked(31, OK),
                Moved(31, Some(Closed)),
                Moved(32, None),
                Class(None),
            ],
        ),
        (
            "a failed probe reports open again; an elapsed cooldown reads half-open",
            1,
            &[
                Ended(0, "a", DOWN),
                Moved(0, Some(Open)),
                Moved(30, Some(HalfOpen)),
                Ask(30, "b", false, Admit::Probe),
                Moved(30, None),
                Ended(31, "b", DOWN),
                Moved(31, Some(Open)),
            ],
        ),
        (
            "a clock that goes backwards keeps it open",
            1,
            &[
                Ended(100, "a", DOWN),
                Ask(50, "a", true, wait(80)),
                State(50, Open),
            ],
        ),
    ];
    for (name, threshold, steps) in table {
        run(name, policy(*threshold), steps);
    }
}

#[test]
fn the_window_can_be_switched_off_and_odd_ratios_are_tamed() {
    let t0 = Instant::now();
    let busy = |b: &mut Breaker, n: u32| {
        for i in 0..n {
            let id = format!("m{i}");
            b.on_attempt(t0, Attempted { id: &id, to: &id }, BUSY);
        }
    };
    let mut off = Breaker::new(BreakerPolicy {
        window_messages: 0,
        ..policy(5)
    });
    busy(&mut off, 100);
    assert_eq!(off.state(t0), Closed);
    assert!(off.window.is_empty());
    // A NaN ratio reads as 1 (all of them), a ratio above 1 too.
    for ratio in [f64::NAN, 7.0] {
        let mut b = Breaker::new(BreakerPolicy {
            window_ratio: ratio,
            ..policy(5)
        });
        b.on_attempt(t0, Attempted { id: "ok", to: "ok" }, OK);
        busy(&mut b, 10);
        assert_eq!(b.state(t0), Closed, "{ratio}");
    }
    // The window is bounded, however many outcomes come.
    let mut big = Breaker::new(BreakerPolicy {
        window_messages: u32::MAX,
        ..policy(5)
    });
    busy(&mut big, (WINDOW_CAP + 10) as u32);
    assert_eq!(big.window.len(), WINDOW_CAP);
}

#[test]
fn failure_count_saturates_and_huge_cooldown_does_not_panic() {
    let t0 = Instant::now();
    let mut b = Breaker::new(BreakerPolicy {
        threshold: u32::MAX,
        cooldown: Duration::MAX,
        ..policy(1)
    });
    let a = Attempted { id: "a", to: "a" };
    for _ in 0..10 {
        b.on_attempt(t0, a, DOWN);
    }
    assert_eq!(b.consecutive_failures(), 10);
    b.inner = Inner::Closed {
        failures: u32::MAX - 1,
    };
    b.on_attempt(t0, a, DOWN);
    assert_eq!(b.state(t0), Open);
    b.on_attempt(t0, a, DOWN);
    let later = t0 + Duration::from_secs(3600 * 24 * 365);
    assert!(matches!(
        b.admit(
            later,
            Candidate {
                id: "a",
                failed_before: true
            }
        ),
        Admit::Wait(_)
    ));
}
