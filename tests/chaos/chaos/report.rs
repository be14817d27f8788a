//! The figures of one run, printed whether it passes or not, and the verdict: no breach, and
//! a storm that was not vacuous.

use super::*;

pub(super) fn report(ran: &Ran, audit: &Audit) {
    let Ran {
        scenario,
        seed,
        n,
        plans,
        cluster,
        storm,
        started,
        submitted_in,
        gate_wait,
        slowest,
        ..
    } = ran;
    let (seed, n) = (*seed, *n);
    let Audit {
        c,
        violations,
        hooks,
        per_scope,
        later_parts,
    } = audit;
    let later_parts = *later_parts;
    let plan_of: BTreeMap<&str, &Plan> = plans.iter().map(|p| (p.key.as_str(), p)).collect();
    let elapsed = started.elapsed();
    let deaths = &cluster.deaths;
    let fired: usize = deaths.failpoints.values().sum();
    let share = 100.0 * c.faulted_units as f64 / c.t as f64;
    let per_fault = |f: fn(&Fault) -> bool| plans.iter().filter(|p| f(&p.fault)).count();
    let balanced = std::mem::take(&mut *ran.balanced.lock().unwrap());
    let per_hook =
        |f: fn(WebhookFault) -> bool| plans.iter().filter(|p| p.hook.is_some_and(f)).count();
    eprintln!(
        "chaos {name}: seed {seed:#x}, {n} keys in {subs} submissions ({tries} tries: {lost} \
         without a reply, {deferred} answered 4xx {deferrals:?}), clients done after \
         {submitted_in:.1?} (a key waited up to {gate_wait:.1?} for a free client; the \
         slowest, {slow_key} {slow_shape}, took {slow:.1?}), all settled after {elapsed:.1?}\n\
         \x20 T={t} units (scope, key, part) attempted, A={a} answered 250, D={d} delivered at \
         the sink after its dedup, R={r} raw sink transactions ({extra} after a commit)\n\
         \x20 mix: {splits} split keys ({racing} sending their parts at once) in {parts} parts, \
         {later} parts past the first delivered, {resent} parts sent again after their 250 \
         ({replayed} answered as a replay); {shared} keys used by two scopes; per scope \
         (A/D): {scopes}\n\
         \x20 per-key faults planned on {planned:.1}% of keys, faults of any kind touched \
         {share:.1}% of units: {sigkill} SIGKILLs, {fired} crash-point aborts \
         {fp:?}, {locks} store locks, {bursts} sink 4xx bursts; per key: {hang} client \
         hang-ups, {drop} replies dropped, {hold} withheld, {cut} cuts, {four} 4xx runs, \
         {past} past the window\n\
         \x20 ledger: {unknown} UNKNOWN attempts, {settled} settled unresolved ({early} not a \
         past-window key), {resolved} of them resolved by an upstream event, {unresolved} \
         still unresolved; longest wait between attempts {gap:.1} s ({gap_unit}); {e01005} \
         E01005 answers to a reused key\n\
         \x20 webhooks: {batches} batches ({events} events) in {posts} posts via the balancer \
         (connections per relay {per_relay:?}, {closed} closed with no relay up), {refused} \
         posts without a 2xx and retried; faults per key: {h_dup} duplicated, {h_reorder} \
         reordered, {h_late} late, {h_lose} lose_ack; {duplicated} batches posted twice, \
         {acks} 2xx treated as lost, {dup_answers} posts answered as a duplicate; \
         {receipts} receipts (one per webhook-id that got a 2xx), {stale} stale events \
         stored unapplied, {resolved} records resolved by event\n\
         \x20 per (scope, key, part): lost {lost_k}, duplicated {dup}, unexpected {unexp}, \
         unanswered {unans}, unexplained extra transactions {unexpl}, mismatched bytes \
         forwarded {mism}, UNKNOWN retried after the window {late}",
        name = scenario.name,
        subs = c.submissions,
        tries = c.tries,
        lost = c.lost_tries,
        deferred = c.deferred_tries,
        deferrals = c.deferrals,
        slow = slowest.0,
        slow_key = slowest.1,
        slow_shape = plan_of
            .get(slowest.1.as_str())
            .map_or(String::new(), |p| format!("{:?}", p.shape)),
        t = c.t,
        a = c.a,
        d = c.d,
        r = c.r,
        extra = c.extra_raw,
        splits = c.split_keys,
        racing = c.racing_splits,
        parts = c.split_parts,
        later = later_parts,
        resent = c.resent,
        replayed = c.replayed,
        shared = c.shared_keys,
        scopes = per_scope
            .iter()
            .map(|(s, (a, d))| format!("{s} {a}/{d}"))
            .collect::<Vec<_>>()
            .join(", "),
        planned = 100.0 * (n - per_fault(|f| *f == Fault::None)) as f64 / n as f64,
        sigkill = deaths.sigkill,
        fp = deaths.failpoints,
        locks = storm.store_locks,
        bursts = storm.sink_bursts,
        hang = per_fault(|f| *f == Fault::ClientHangup),
        drop = per_fault(|f| *f == Fault::SinkDrop),
        hold = per_fault(|f| *f == Fault::SinkWithhold),
        cut = per_fault(|f| *f == Fault::SinkCut),
        four = per_fault(|f| matches!(f, Fault::Sink4xx(_))),
        past = per_fault(|f| *f == Fault::PastWindow),
        unknown = c.unknown_attempts,
        unresolved = c.unresolved,
        settled = hooks.settled_unresolved,
        resolved = hooks.resolved,
        batches = hooks.batches,
        events = hooks.events,
        posts = hooks.posts,
        per_relay = balanced.per_relay,
        closed = balanced.closed,
        refused = hooks.refused_posts,
        h_dup = per_hook(|f| f == WebhookFault::Duplicate),
        h_reorder = per_hook(|f| f == WebhookFault::Reorder),
        h_late = per_hook(|f| matches!(f, WebhookFault::Late(_))),
        h_lose = per_hook(|f| f == WebhookFault::LoseAck),
        duplicated = hooks.duplicated,
        acks = hooks.acks_lost,
        dup_answers = hooks.duplicate_answers,
        receipts = hooks.receipts,
        stale = hooks.stale,
        early = c.parked_early,
        gap = c.longest_gap_ms as f64 / 1000.0,
        gap_unit = c.longest_gap_unit,
        e01005 = c.e01005,
        lost_k = c.lost,
        dup = c.duplicated,
        unexp = c.unexpected,
        unans = c.unanswered,
        unexpl = c.unexplained_extra,
        mism = c.mismatched_forwarded,
        late = c.unknown_after_window,
    );

    let context = || {
        let shown: Vec<&String> = violations.iter().take(25).collect();
        format!(
            "chaos {}: seed {seed:#x} ({SEED_ENV}={:#x} replays it); {} violations, first \
             ones:\n{}\n{}",
            scenario.name,
            self::seed(),
            violations.len(),
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            cluster.logs()
        )
    };
    assert_eq!(c.lost, 0, "lost\n{}", context());
    assert_eq!(c.duplicated, 0, "duplicated\n{}", context());
    assert_eq!(c.unexpected, 0, "unexpected\n{}", context());
    assert_eq!(c.unanswered, 0, "unanswered\n{}", context());
    assert_eq!(c.unexplained_extra, 0, "unexplained extra\n{}", context());
    assert_eq!(c.mismatched_forwarded, 0, "mismatched\n{}", context());
    assert_eq!(
        c.unknown_after_window,
        0,
        "late UNKNOWN retry\n{}",
        context()
    );
    assert!(violations.is_empty(), "{}", context());
    // Not vacuous: the storm happened, and the checks had something to check.
    assert!(
        deaths.sigkill + fired >= 3,
        "too few relay deaths: {deaths:?}"
    );
    assert!(c.unknown_attempts > 0 && c.extra_raw > 0, "{c:?}");
    assert!(c.e01005 > 0, "no key reuse was refused: {c:?}");
    assert!(
        later_parts > 0 && c.replayed > 0 && c.shared_keys > 0,
        "no split or shared key in the mix: {c:?}"
    );
    let all_scopes = std::iter::once(ANON_SCOPE).chain(USERS.iter().map(|u| u.2));
    for scope in all_scopes {
        assert!(
            per_scope.get(scope).is_some_and(|&(_, d)| d > 0),
            "nothing delivered for scope {scope}: {per_scope:?}"
        );
    }
    // The events had work to do: duplicates recognised, a reordered event kept stale, an
    // unresolved record resolved.
    assert!(
        hooks.resolved > 0 && hooks.duplicate_answers > 0 && hooks.acks_lost > 0 && hooks.stale > 0,
        "{hooks:?}"
    );
    assert!(
        share >= 20.0,
        "faults touched only {share:.1}% of units: {c:?}"
    );
}
