//! Split transactions (docs/concepts/contract.md "What the relay answers at the end of DATA"): which part of an operation a submission under a taken key
//! is. Pure: decided from the live parts the store returned.

use crate::mail::Fingerprint;
use crate::store::Existing;

/// What a submission under a taken key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartChoice<'a> {
    /// A retry of this part: replay its reply.
    Replay(&'a Existing),
    /// Another part of the same message (same bytes, sender and parameters, recipients
    /// disjoint from every earlier part's): store it as this part number.
    New(u32),
    /// Anything else under the key: E01005.
    Reuse,
}

/// `parts`: the live records under the key. Recipients are compared without case, local part
/// included (a mailbox's case may or may not matter to its domain; Unicode case for U-labels),
/// which errs towards E01005: stricter than the rule that makes two RCPTs one mailbox, on
/// purpose, since a wrong "disjoint" here delivers twice.
pub fn choose_part<'a>(
    fingerprint: &Fingerprint,
    message_fp: &Fingerprint,
    rcpt_to: &[String],
    parts: &'a [Existing],
) -> PartChoice<'a> {
    if let Some(same) = parts.iter().find(|p| p.fingerprint == *fingerprint) {
        return PartChoice::Replay(same);
    }
    let ours: Vec<String> = rcpt_to.iter().map(|r| r.to_lowercase()).collect();
    let another_part = parts.iter().all(|p| {
        p.message_fp.as_ref() == Some(message_fp)
            && p.rcpt_to.iter().all(|r| !ours.contains(&r.to_lowercase()))
    });
    match parts.iter().map(|p| p.part).max() {
        Some(last) if another_part => PartChoice::New(last.saturating_add(1)),
        _ => PartChoice::Reuse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::State;

    fn fp(n: u8) -> Fingerprint {
        Fingerprint::from_bytes([n; 32])
    }

    fn part(n: u32, full: u8, message: Option<u8>, rcpts: &[&str]) -> Existing {
        Existing {
            id: format!("id{n}"),
            fingerprint: fp(full),
            reply: "250 2.0.0 OK queued as x".into(),
            state: State::Queued,
            part: n,
            message_fp: message.map(fp),
            rcpt_to: rcpts.iter().map(|r| r.to_string()).collect(),
        }
    }

    fn rcpts(list: &[&str]) -> Vec<String> {
        list.iter().map(|r| r.to_string()).collect()
    }

    #[test]
    fn parts_are_told_from_retries_and_reuses() {
        let first = part(1, 10, Some(1), &["a@x", "b@x"]);
        let second = part(2, 20, Some(1), &["c@x"]);
        let both = [first.clone(), second.clone()];
        let old = [part(1, 10, None, &["a@x"])];
        let unicode = [part(1, 10, Some(1), &["u@bücher.example"])];
        // (submission's fingerprint, message fingerprint, recipients, parts, expected)
        type Row<'a> = (u8, u8, &'a [&'a str], &'a [Existing], PartChoice<'a>);
        let table: [Row; 9] = [
            // A retry of a part, whichever it is.
            (10, 1, &["a@x", "b@x"], &both, PartChoice::Replay(&both[0])),
            (20, 1, &["c@x"], &both, PartChoice::Replay(&both[1])),
            // The rest of the recipients: the next part.
            (30, 1, &["c@x"], &both[..1], PartChoice::New(2)),
            (40, 1, &["d@x", "e@x"], &both, PartChoice::New(3)),
            // Overlapping recipients (case aside), or other bytes: a reuse.
            (50, 1, &["B@X", "d@x"], &both, PartChoice::Reuse),
            (50, 1, &["u@BÜCHER.example"], &unicode, PartChoice::Reuse),
            (60, 2, &["d@x"], &both, PartChoice::Reuse),
            // A record from before parts existed takes none.
            (70, 1, &["d@x"], &old, PartChoice::Reuse),
            (10, 1, &["a@x"], &old, PartChoice::Replay(&old[0])),
        ];
        for (full, message, to, parts, want) in table {
            assert_eq!(
                choose_part(&fp(full), &fp(message), &rcpts(to), parts),
                want,
                "{full} {message} {to:?}"
            );
        }
    }
}
