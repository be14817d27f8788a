//! The clients: submitting a key until it is answered, and what each was told.

use super::*;

/// One try of a submission.
pub(super) enum Try {
    /// The reply that ended the try: to the greeting, a command, or the final dot.
    Answer(u16, String),
    /// No reply: connection refused or closed, a timeout, or our own hang-up.
    Lost,
}

pub(super) struct Conn {
    pub(super) stream: TcpStream,
    pub(super) buf: Vec<u8>,
}

impl Conn {
    /// The last line of one reply, `None` when the connection closed first.
    pub(super) async fn reply(&mut self) -> Option<(u16, String)> {
        loop {
            while let Some(pos) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..pos + 2).collect();
                let text = String::from_utf8_lossy(&line[..pos]).to_string();
                let code: u16 = text.get(..3)?.parse().ok()?;
                if text.as_bytes().get(3) != Some(&b'-') {
                    return Some((code, text));
                }
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    pub(super) async fn command(&mut self, line: &str) -> Option<(u16, String)> {
        self.stream
            .write_all(format!("{line}\r\n").as_bytes())
            .await
            .ok()?;
        self.reply().await
    }
}

/// An unauthenticated submission to `rcpt@example.com` (also the power-loss test's).
pub(super) async fn submit_once(addr: SocketAddr, message: &[u8], hang_up: bool) -> Try {
    submit_as(
        addr,
        None,
        &["rcpt@example.com".to_string()],
        message,
        hang_up,
    )
    .await
}

/// One try: `AUTH PLAIN` first when `login` names a user.
pub(super) async fn submit_as(
    addr: SocketAddr,
    login: Option<(&str, &str)>,
    rcpts: &[String],
    message: &[u8],
    hang_up: bool,
) -> Try {
    let attempt = async {
        let stream = TcpStream::connect(addr).await.ok()?;
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
        };
        let greeting = conn.reply().await?;
        if greeting.0 != 220 {
            return Some(Try::Answer(greeting.0, greeting.1));
        }
        let mut steps = vec!["EHLO chaos.test".to_string()];
        steps.extend(login.map(|(user, password)| common::auth_plain(user, password)));
        steps.push("MAIL FROM:<sender@example.com>".into());
        steps.extend(rcpts.iter().map(|r| format!("RCPT TO:<{r}>")));
        steps.push("DATA".into());
        for step in &steps {
            let (code, line) = conn.command(step).await?;
            if code >= 400 {
                return Some(Try::Answer(code, line));
            }
        }
        conn.stream.write_all(&dot_stuff(message)).await.ok()?;
        if hang_up {
            // Gone before the reply could be read: the relay may or may not have committed.
            return Some(Try::Lost);
        }
        let (code, line) = conn.reply().await?;
        let _ = conn.stream.write_all(b"QUIT\r\n").await;
        Some(Try::Answer(code, line))
    };
    match tokio::time::timeout(TRY_LIMIT, attempt).await {
        Ok(Some(t)) => t,
        Ok(None) | Err(_) => Try::Lost,
    }
}

#[derive(Debug, Clone)]
pub(super) enum Final {
    Accepted,
    Refused(String),
    GaveUp,
}

/// What one client saw for one ask, across its tries.
#[derive(Debug, Clone)]
pub(super) struct Submitted {
    pub(super) ask: Ask,
    /// The ask was answered 250 before: this is a client's retry of it, which must replay.
    pub(super) resend: bool,
    /// The part number the relay must have given it: parts sent one after the other are
    /// numbered in that order.
    pub(super) expect_part: Option<u32>,
    pub(super) last: Final,
    pub(super) tries: u32,
    /// Tries without a reply (refused connection, a dead relay, our hang-up).
    pub(super) lost: u32,
    /// Tries answered 4xx, and by what (code and error code, or the reply's first words).
    pub(super) deferred: u32,
    pub(super) deferrals: BTreeMap<String, u32>,
    /// The 250 line and its queue id.
    pub(super) accepted: Option<(String, String)>,
}

/// A reply line without its variable parts: the code and its `(Ennnnn ...)` error code when
/// it has one, else its first words.
pub(super) fn reply_kind(line: &str) -> String {
    match line.find("(E0") {
        Some(at) => format!(
            "{} {}",
            line.get(..3).unwrap_or(line),
            line[at + 1..].split_whitespace().next().unwrap_or_default()
        ),
        None => line
            .split_whitespace()
            .take(4)
            .collect::<Vec<_>>()
            .join(" "),
    }
}

pub(super) fn queue_id(line: &str) -> Option<String> {
    let rest = &line[line.find("queued as ")? + "queued as ".len()..];
    rest.split_whitespace().next().map(str::to_string)
}

pub(super) type Addrs = Arc<Mutex<Vec<Option<SocketAddr>>>>;

/// Submits until a 250 or a 5xx, as a well-behaved client: same bytes every time, another
/// instance after a failure, a short random pause between tries.
pub(super) async fn submit_until_answered(
    addrs: Addrs,
    start: usize,
    plan: Arc<Plan>,
    ask: Ask,
    hang_up_first: bool,
    mut rng: fastrand::Rng,
) -> Submitted {
    let message = message_bytes(&plan, ask.variant);
    let rcpts = recipients(&plan, ask.set);
    let mut out = Submitted {
        ask,
        resend: false,
        expect_part: None,
        last: Final::GaveUp,
        tries: 0,
        lost: 0,
        deferred: 0,
        deferrals: BTreeMap::new(),
        accepted: None,
    };
    let deadline = Instant::now() + KEY_LIMIT;
    while Instant::now() < deadline {
        let addr = {
            let addrs = addrs.lock().unwrap();
            let n = addrs.len();
            (0..n).find_map(|i| addrs[(start + out.tries as usize + i) % n])
        };
        let Some(addr) = addr else {
            // Every instance is being restarted.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let hang_up = hang_up_first && out.tries == 0;
        out.tries += 1;
        match submit_as(addr, ask.who.login(), &rcpts, &message, hang_up).await {
            Try::Answer(250, line) => {
                let id = queue_id(&line).unwrap_or_else(|| format!("250 without id: {line}"));
                out.accepted = Some((line, id));
                out.last = Final::Accepted;
                return out;
            }
            Try::Answer(code, line) if code >= 500 => {
                out.last = Final::Refused(line);
                return out;
            }
            Try::Answer(_, line) => {
                out.deferred += 1;
                *out.deferrals.entry(reply_kind(&line)).or_default() += 1;
            }
            Try::Lost => out.lost += 1,
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(10..120))).await;
    }
    out
}

pub(super) async fn run_key(
    plan: Plan,
    addrs: Addrs,
    instances: usize,
    seed: u64,
) -> Vec<Submitted> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let start = rng.usize(0..instances);
    let hang_up = plan.fault == Fault::ClientHangup;
    let plan = Arc::new(plan);
    let one = |who: Who, variant: char, set: usize, start: usize, hang_up: bool, rng| {
        let ask = Ask { who, variant, set };
        submit_until_answered(addrs.clone(), start, plan.clone(), ask, hang_up, rng)
    };
    match plan.shape {
        Shape::Single => vec![one(Who::Anonymous, 'a', 0, start, hang_up, rng.fork()).await],
        // Two clients at the same moment, on different instances when there are several.
        Shape::SameBytesTwice | Shape::DifferentBytesTwice => {
            let second = if plan.shape == Shape::SameBytesTwice {
                'a'
            } else {
                'b'
            };
            let (x, y) = tokio::join!(
                one(Who::Anonymous, 'a', 0, start, hang_up, rng.fork()),
                one(Who::Anonymous, second, 0, start + 1, false, rng.fork())
            );
            vec![x, y]
        }
        Shape::TwoScopes(x, y) => {
            let (x, y) = tokio::join!(
                one(x, 'a', 0, start, hang_up, rng.fork()),
                one(y, 'b', 0, start + 1, false, rng.fork())
            );
            vec![x, y]
        }
        Shape::Split { who, parts, racing } => {
            let mut out = Vec::new();
            if racing {
                let mut racers = tokio::task::JoinSet::new();
                for part in 0..parts {
                    racers.spawn(one(
                        who,
                        'a',
                        part,
                        start + part,
                        hang_up && part == 0,
                        rng.fork(),
                    ));
                }
                out = racers.join_all().await;
                out.sort_by_key(|s| s.ask.set);
            } else {
                for part in 0..parts {
                    let mut s = one(
                        who,
                        'a',
                        part,
                        start + part,
                        hang_up && part == 0,
                        rng.fork(),
                    )
                    .await;
                    s.expect_part = Some(part as u32 + 1);
                    let accepted = s.accepted.is_some();
                    out.push(s);
                    if !accepted {
                        // A client gives up on the message; the checks say why.
                        break;
                    }
                }
            }
            // A client that did not hear the 250 in time (or a careless one) sends it again.
            let answered: Vec<usize> = out
                .iter()
                .filter(|s| s.accepted.is_some())
                .map(|s| s.ask.set)
                .collect();
            for part in answered.into_iter().rev() {
                let mut s = one(who, 'a', part, start + part + 1, false, rng.fork()).await;
                s.resend = true;
                out.push(s);
            }
            out
        }
    }
}
