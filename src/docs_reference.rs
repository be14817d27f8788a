//! What the generated reference pages (`docs/reference/`, written and checked by the test
//! `tests/in_process/docs_reference`) read of the crate that a test cannot reach: the metrics
//! registry and the reply constructors are crate-private. Hidden from the crate's docs; not an
//! interface for programs.

use std::time::Duration;

use crate::metrics::{Format, Metrics, Snapshot};
use crate::reply::Reply;
use crate::store::{QueueStats, State};

/// The OpenMetrics exposition of a fresh relay registry with every family exercised once, so
/// that each label a family has shows up in a sample. Values mean nothing; only names, types,
/// HELP texts and label names and values are read.
pub fn metrics_exposition() -> String {
    let labels = crate::app::relay_label_values();
    let m = Metrics::new(&labels);
    let decision = labels.decisions.first().copied().unwrap_or("");
    for &(outcome, phase) in &labels.attempt_endings {
        m.attempt(outcome, Some(phase), decision, Duration::ZERO);
    }
    let stats = QueueStats {
        by_state: State::ALL.iter().map(|&s| (s, 0)).collect(),
        oldest_queued_at_ms: None,
        damaged: 0,
        unmatched_events: 0,
        queued_by_scope: Vec::new(),
    };
    let snapshot = Snapshot {
        stats: Some(stats),
        ..Snapshot::default()
    };
    m.render(&snapshot, Format::OpenMetrics)
}

/// Every reply constructor of [`Reply`], called with placeholders for its arguments, by name.
/// The page takes each one's "when" from its doc comment in `crates/model/src/reply.rs`, and the test fails
/// when a constructor there is missing here.
pub fn reply_catalogue() -> Vec<(&'static str, Reply)> {
    macro_rules! entries {
        ($($name:ident($($arg:expr),*)),* $(,)?) => {
            vec![$((stringify!($name), Reply::$name($($arg),*))),*]
        };
    }
    entries![
        greeting("<hostname>"),
        ehlo(
            "<hostname>",
            "<client>",
            &crate::reply::EhloLimits {
                max_size: 26_214_400,
                max_transactions: 1000,
                max_recipients: 100,
            }
        ),
        helo("<hostname>", "<client>"),
        bye(),
        shutting_down(),
        timeout(),
        too_many_errors(),
        store_unavailable_at_connect(),
        bare_line_ending(),
        ok(),
        reset_ok(),
        sender_ok(),
        recipient_ok(),
        start_data(),
        chunk_ok(4096),
        cannot_vrfy(),
        help(),
        line_too_long(),
        unknown_command(),
        not_implemented("<command>"),
        syntax("<usage>"),
        bad_characters(),
        bad_sender_address(),
        bad_recipient_address(),
        bad_helo_name(),
        duplicate_parameter("<parameter>"),
        non_ascii_address(),
        header_section_too_large(),
        unsupported_parameter("<parameter>"),
        need_helo(),
        need_mail(),
        nested_mail(),
        no_valid_recipients(),
        mixed_data_bdat(),
        ready_for_tls(),
        tls_already_active(),
        requiretls_needs_tls(),
        starttls_first(),
        encryption_required_for_auth(),
        auth_ok(),
        auth_failed(),
        too_many_auth_failures(),
        already_authenticated(),
        auth_during_transaction(),
        unsupported_mechanism(),
        bad_sasl_response(),
        auth_cancelled(),
        sender_not_allowed(),
        early_talker(),
        too_many_connections(),
        session_too_long(),
        too_slow(),
        auth_required(),
        too_many_recipients(),
        too_many_transactions(),
        message_too_big(),
        data_line_too_long(),
        nul_in_data(),
        no_header_section(),
        key_in_malformed_header_section(),
        no_from_header(),
        queued("<id>"),
        key_reuse(false),
        key_reuse(true),
        key_in_progress(),
        key_invalid(),
        key_required(),
        store_unavailable(),
        delivered_before_queue("<id>", "<upstream reply>"),
        refused_before_queue(550, "5.1.1", "<id>", "<upstream reply>"),
        requiretls_refused_before_queue("<id>"),
        verdict_not_recorded("<id>"),
    ]
}
