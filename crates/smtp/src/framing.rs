//! Strict CRLF line framing and the DATA/BDAT body receivers. No I/O: callers hand in bytes.
//!
//! Every line must end in CRLF. A CR not followed by LF, or an LF not preceded by CR, is a
//! "bare line ending": the smuggling vector (`\n.\n`, `\r\n.\r\r\n`, ...) that lets two SMTP
//! implementations disagree about where a message ends, so it is never repaired, only refused.

/// What the scanner found at the front of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// A whole line of this many bytes, CRLF included.
    Line(usize),
    /// This many bytes of a line that is already longer than the limit and has no end yet.
    Partial(usize),
    /// A bare CR or bare LF.
    BareLineEnding,
    /// Not enough bytes to decide.
    NeedMore,
}

/// Finds the first line in `buf`. A line still open after `max` bytes is handed out as
/// `Partial` so that a peer cannot make us buffer without bound.
pub fn next_piece(buf: &[u8], max: usize) -> Piece {
    match buf.iter().position(|&b| b == b'\r' || b == b'\n') {
        Some(i) if buf[i] == b'\n' => Piece::BareLineEnding,
        Some(i) => match buf.get(i + 1) {
            Some(b'\n') => Piece::Line(i + 2),
            Some(_) => Piece::BareLineEnding,
            // A CR at the very end may still be followed by LF: keep it back.
            None if i >= max => Piece::Partial(i),
            None => Piece::NeedMore,
        },
        None if buf.len() >= max => Piece::Partial(buf.len()),
        None => Piece::NeedMore,
    }
}

/// Limits applied to a message body while it is received.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Longest line, CRLF excluded (RFC 5321: 998).
    pub max_line: usize,
    /// Largest message accepted; bytes past it are read and discarded.
    pub max_size: usize,
}

/// Why a received body cannot be accepted. The body is still read to its end so the session
/// stays in step with the client; the reply comes at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFault {
    LineTooLong,
    Nul,
    TooBig,
}

impl BodyFault {
    fn rank(self) -> u8 {
        match self {
            BodyFault::Nul => 0,
            BodyFault::LineTooLong => 1,
            BodyFault::TooBig => 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyStatus {
    NeedMore,
    /// DATA only: the terminating `.` line was consumed.
    Complete,
    BareLineEnding,
}

/// Receives a message body either dot-stuffed (DATA) or raw (BDAT chunks), enforcing the
/// CRLF discipline and limits, and keeps the message bytes (after dot-unstuffing).
#[derive(Debug)]
pub struct BodyReceiver {
    limits: BodyLimits,
    message: Vec<u8>,
    size: usize,
    line_len: usize,
    fault: Option<BodyFault>,
    /// BDAT: bytes of an unfinished line carried from one chunk to the next (at most a CR).
    carry: Vec<u8>,
}

impl BodyReceiver {
    pub fn new(limits: BodyLimits) -> Self {
        BodyReceiver {
            limits,
            message: Vec::new(),
            size: 0,
            line_len: 0,
            fault: None,
            carry: Vec::new(),
        }
    }

    pub fn fault(&self) -> Option<BodyFault> {
        self.fault
    }

    pub fn into_message(self) -> Result<Vec<u8>, BodyFault> {
        match self.fault {
            Some(fault) => Err(fault),
            None => Ok(self.message),
        }
    }

    fn set_fault(&mut self, fault: BodyFault) {
        // The most serious fault decides the reply, so that it does not depend on how the
        // bytes were split into reads; a too-big body also frees what it held.
        if self.fault.is_none_or(|f| fault.rank() > f.rank()) {
            self.fault = Some(fault);
        }
        if fault == BodyFault::TooBig {
            self.message = Vec::new();
        }
    }

    /// Appends message content that belongs to the current line; `stuffed` counts the
    /// transparency dot removed in front of it, since the limit is on the line as sent.
    fn push_content(&mut self, content: &[u8], stuffed: bool) {
        self.line_len += content.len() + usize::from(stuffed);
        if self.line_len > self.limits.max_line {
            self.set_fault(BodyFault::LineTooLong);
        }
        if content.contains(&0) {
            self.set_fault(BodyFault::Nul);
        }
        self.add_bytes(content);
    }

    fn end_line(&mut self) {
        self.add_bytes(b"\r\n");
        self.line_len = 0;
    }

    fn add_bytes(&mut self, bytes: &[u8]) {
        self.size += bytes.len();
        if self.size > self.limits.max_size {
            self.set_fault(BodyFault::TooBig);
        }
        if self.fault.is_none() {
            self.message.extend_from_slice(bytes);
        }
    }

    /// DATA: consumes a prefix of `buf`; returns how many bytes were used and the status.
    pub fn feed_dotted(&mut self, buf: &[u8]) -> (usize, BodyStatus) {
        let mut used = 0;
        let piece_max = self.limits.max_line + 2;
        loop {
            let rest = &buf[used..];
            match next_piece(rest, piece_max) {
                Piece::NeedMore => return (used, BodyStatus::NeedMore),
                Piece::BareLineEnding => return (used, BodyStatus::BareLineEnding),
                Piece::Line(n) => {
                    let line = &rest[..n - 2];
                    used += n;
                    let at_start = self.line_len == 0;
                    if at_start && line == b"." {
                        return (used, BodyStatus::Complete);
                    }
                    let stuffed = at_start && line.first() == Some(&b'.');
                    let content = if stuffed { &line[1..] } else { line };
                    self.push_content(content, stuffed);
                    self.end_line();
                }
                Piece::Partial(n) => {
                    let part = &rest[..n];
                    used += n;
                    let stuffed = self.line_len == 0 && part.first() == Some(&b'.');
                    let content = if stuffed { &part[1..] } else { part };
                    // A partial is at least `piece_max` bytes, so the content is never empty
                    // and line_len leaves 0: the next piece is not un-stuffed again.
                    self.push_content(content, stuffed);
                }
            }
        }
    }

    /// BDAT: takes one whole chunk (or part of one). Line structure is checked across chunk
    /// boundaries; there is no dot-stuffing.
    pub fn feed_raw(&mut self, chunk: &[u8]) -> BodyStatus {
        let mut buf = std::mem::take(&mut self.carry);
        buf.extend_from_slice(chunk);
        let mut used = 0;
        loop {
            let rest = &buf[used..];
            match next_piece(rest, usize::MAX) {
                Piece::BareLineEnding => return BodyStatus::BareLineEnding,
                Piece::Line(n) => {
                    self.push_content(&rest[..n - 2], false);
                    self.end_line();
                    used += n;
                }
                Piece::Partial(_) | Piece::NeedMore => {
                    // Everything but a trailing CR is content of the current line.
                    let keep = usize::from(rest.last() == Some(&b'\r'));
                    let content_len = rest.len() - keep;
                    let content = rest[..content_len].to_vec();
                    if !content.is_empty() {
                        self.push_content(&content, false);
                    }
                    self.carry = rest[content_len..].to_vec();
                    return BodyStatus::NeedMore;
                }
            }
        }
    }

    /// BDAT LAST: the message may end without CRLF, but not with a lone CR.
    pub fn finish_raw(&mut self) -> BodyStatus {
        if self.carry.is_empty() {
            BodyStatus::Complete
        } else {
            BodyStatus::BareLineEnding
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BodyLimits = BodyLimits {
        max_line: 998,
        max_size: 10_000,
    };

    #[test]
    fn pieces() {
        assert_eq!(next_piece(b"NOOP\r\nQUIT", 100), Piece::Line(6));
        assert_eq!(next_piece(b"NOOP\r", 100), Piece::NeedMore);
        assert_eq!(next_piece(b"NOOP", 100), Piece::NeedMore);
        assert_eq!(next_piece(b"NOOP\n", 100), Piece::BareLineEnding);
        assert_eq!(next_piece(b"NO\rOP\r\n", 100), Piece::BareLineEnding);
        assert_eq!(next_piece(b"abcdef", 4), Piece::Partial(6));
        assert_eq!(next_piece(b"abcd\r", 4), Piece::Partial(4));
        assert_eq!(next_piece(b"abcdefgh\r\n", 4), Piece::Line(10));
    }

    fn data(input: &[u8]) -> (Result<Vec<u8>, BodyFault>, BodyStatus, usize) {
        let mut rx = BodyReceiver::new(LIMITS);
        let (used, status) = rx.feed_dotted(input);
        (rx.into_message(), status, used)
    }

    #[test]
    fn dot_unstuffing_and_terminator() {
        let (msg, status, used) = data(b"A: b\r\n\r\n..x\r\n.\r\n\r\n.\r\nNOOP\r\n");
        assert_eq!(status, BodyStatus::Complete);
        assert_eq!(used, 16);
        assert_eq!(msg.unwrap(), b"A: b\r\n\r\n.x\r\n");
    }

    #[test]
    fn smuggling_sequences_are_bare_line_endings() {
        for seq in [
            &b"A: b\r\n\n.\n"[..],
            b"A: b\r\n\n.\r\n",
            b"A: b\r\n.\n",
            b"A: b\r\r.\r\r",
            b"A: b\r\n.\r\r\n",
        ] {
            let (_, status, _) = data(seq);
            assert_eq!(status, BodyStatus::BareLineEnding, "{seq:?}");
        }
    }

    #[test]
    fn faults_are_reported_after_the_end() {
        let long = [b'x'; 999];
        let mut input = long.to_vec();
        input.extend_from_slice(b"\r\n.\r\n");
        assert_eq!(data(&input).0, Err(BodyFault::LineTooLong));
        assert_eq!(data(&input).1, BodyStatus::Complete);
        assert_eq!(data(b"A: \0\r\n.\r\n").0, Err(BodyFault::Nul));
        let mut big = Vec::new();
        for _ in 0..200 {
            big.extend_from_slice(&[b'y'; 98]);
            big.extend_from_slice(b"\r\n");
        }
        big.extend_from_slice(b".\r\n");
        let (msg, status, used) = data(&big);
        assert_eq!(
            (msg, status, used),
            (Err(BodyFault::TooBig), BodyStatus::Complete, big.len())
        );
    }

    #[test]
    fn a_998_octet_line_is_fine() {
        let mut input = vec![b'x'; 998];
        input.extend_from_slice(b"\r\n.\r\n");
        assert_eq!(data(&input).0.unwrap().len(), 1000);
    }

    #[test]
    fn the_limit_counts_the_transparency_dot() {
        let mut input = vec![b'.'];
        input.extend(std::iter::repeat_n(b'x', 998));
        input.extend_from_slice(b"\r\n.\r\n");
        assert_eq!(data(&input).0, Err(BodyFault::LineTooLong));
    }

    #[test]
    fn long_line_split_into_partials_unstuffs_once() {
        let mut rx = BodyReceiver::new(LIMITS);
        let mut line = b"..".to_vec();
        line.extend(std::iter::repeat_n(b'z', 1500));
        let (used, st) = rx.feed_dotted(&line);
        assert_eq!((used, st), (line.len(), BodyStatus::NeedMore));
        let (_, st) = rx.feed_dotted(b"\r\n.\r\n");
        assert_eq!(st, BodyStatus::Complete);
        assert_eq!(rx.into_message(), Err(BodyFault::LineTooLong));
    }

    #[test]
    fn raw_chunks_check_crlf_across_boundaries() {
        let mut rx = BodyReceiver::new(LIMITS);
        assert_eq!(rx.feed_raw(b"A: b\r"), BodyStatus::NeedMore);
        assert_eq!(rx.feed_raw(b"\n\r\nbody"), BodyStatus::NeedMore);
        assert_eq!(rx.feed_raw(b" more\r\n.x"), BodyStatus::NeedMore);
        assert_eq!(rx.finish_raw(), BodyStatus::Complete);
        assert_eq!(rx.into_message().unwrap(), b"A: b\r\n\r\nbody more\r\n.x");

        let mut rx = BodyReceiver::new(LIMITS);
        assert_eq!(rx.feed_raw(b"A: b\r"), BodyStatus::NeedMore);
        assert_eq!(rx.feed_raw(b"X"), BodyStatus::BareLineEnding);

        let mut rx = BodyReceiver::new(LIMITS);
        assert_eq!(rx.feed_raw(b"A: b\r"), BodyStatus::NeedMore);
        assert_eq!(rx.finish_raw(), BodyStatus::BareLineEnding);
    }
}
