//! The sink's SMTP side: the listener (which `Down::Refuse` closes and `resume` rebinds) and
//! one task per connection running the command loop, STARTTLS and AUTH included.
//!
//! Replies are buffered and written whenever the input holds no further complete line, so a
//! pipelining client gets its replies in order and in few writes. Everything a fault rule does
//! happens here, at the phase it names; the dot itself is decided in `state`.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use smtp_proto::{
    Error as ProtoError, MailFrom, RcptTo, Request, AUTH_LOGIN, AUTH_PLAIN, MAIL_BODY_8BITMIME,
    MAIL_BODY_BINARYMIME, MAIL_REQUIRETLS, MAIL_RET_FULL, MAIL_RET_HDRS, MAIL_SMTPUTF8,
    RCPT_NOTIFY_DELAY, RCPT_NOTIFY_FAILURE, RCPT_NOTIFY_NEVER, RCPT_NOTIFY_SUCCESS,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};

use super::faults::{Context, FaultAction, FaultStage};
use super::key::read_key;
use super::life::{shutting_down, went_down, Down, Life};
use super::state::{Control, DotHandover, Shared};
use idemrelay_model::reply::Reply;
use idemrelay_smtp::framing::{next_piece, BodyLimits, BodyReceiver, BodyStatus, Piece};
use idemrelay_smtp::sasl::{Mechanism as SaslMechanism, SaslExchange, SaslStep};

/// Longest command line, CRLF included (RFC 5321 allows 512; AUTH responses need more).
const MAX_COMMAND_LINE: usize = 2048;
const MAX_DATA_LINE: usize = 998;
const MAX_RECIPIENTS: usize = 1000;
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// The least free room in the read buffer before each read, as the relay's own 64 KiB reads.
const READ_CHUNK: usize = 64 * 1024;
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // `resume` rebinds the port it just closed; connections of the old socket may still be
    // in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn accept(listener: Option<&TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

/// Accepts until shutdown; `Control::Listen` closes or reopens the socket. Each connection
/// holds a clone of `alive` so shutdown can wait for them.
pub(crate) async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut control: mpsc::Receiver<Control>,
    alive: mpsc::Sender<()>,
) {
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(err) => {
            tracing::error!(error = %err, "sink listener has no address");
            return;
        }
    };
    let mut listener = Some(listener);
    let mut life = shared.life.subscribe();
    loop {
        tokio::select! {
            cmd = control.recv() => match cmd {
                Some(Control::Listen(open, ack)) => {
                    let result = match (open, listener.is_some()) {
                        (true, false) => bind(addr).map(|l| listener = Some(l)),
                        (false, _) => {
                            listener = None;
                            Ok(())
                        }
                        (true, true) => Ok(()),
                    };
                    tracing::info!(%addr, listening = listener.is_some(), "sink listener");
                    let _ = ack.send(result);
                }
                None => break,
            },
            accepted = accept(listener.as_ref()) => match accepted {
                Ok((stream, peer)) => {
                    let shared = shared.clone();
                    let alive = alive.clone();
                    tokio::spawn(async move {
                        let _alive = alive;
                        if let Err(err) = connection(shared, stream, peer).await {
                            tracing::debug!(%peer, error = %err, "sink connection ended with an error");
                        }
                    });
                }
                Err(err) => {
                    tracing::warn!(error = %err, "sink accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = shutting_down(&mut life) => break,
        }
    }
}

async fn connection(
    shared: Arc<Shared>,
    mut stream: TcpStream,
    peer: SocketAddr,
) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    shared.count_connection();
    tracing::debug!(%peer, "sink connection");
    let life = *shared.life.borrow();
    match life {
        Life::Up => {}
        Life::Down(Down::Greet421) => {
            stream
                .write_all(b"421 4.3.2 Service not available (sink is down)\r\n")
                .await?;
            return stream.shutdown().await;
        }
        Life::Down(Down::Refuse) | Life::ShuttingDown => return Ok(()),
    }
    let mut session = Session::new(shared.clone());
    if shared.config.implicit_tls {
        let mut tls = handshake(&shared, stream).await?;
        session.tls = true;
        session.run(&mut tls, true).await?;
        let _ = tls.shutdown().await;
        return Ok(());
    }
    match session.run(&mut stream, true).await? {
        End::Closed => {
            let _ = stream.shutdown().await;
        }
        End::StartTls => {
            let mut tls = handshake(&shared, stream).await?;
            session.start_tls();
            session.run(&mut tls, false).await?;
            let _ = tls.shutdown().await;
        }
    }
    Ok(())
}

async fn handshake(
    shared: &Shared,
    stream: TcpStream,
) -> io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
    let acceptor = shared
        .tls
        .clone()
        .ok_or_else(|| io::Error::other("TLS is not configured"))?;
    tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))?
}

enum Flow {
    Continue,
    Close,
    StartTls,
}

enum End {
    Closed,
    StartTls,
}

enum Mode {
    Command,
    /// The rest of an over-long line, up to its CRLF.
    DiscardLine,
    /// A SASL exchange: the next line is the client's response.
    Sasl(SaslExchange),
}

struct Txn {
    mail_from: String,
    eightbitmime: bool,
    smtputf8: bool,
    rcpt_to: Vec<String>,
    /// The command lines as received, for the record (what a client passed on, byte for byte).
    mail_command: String,
    rcpt_commands: Vec<String>,
}

/// A command line as received, without its CRLF.
fn raw_command(line: &[u8]) -> String {
    String::from_utf8_lossy(line.strip_suffix(b"\r\n").unwrap_or(line)).into_owned()
}

enum Event {
    Read(Result<io::Result<usize>, tokio::time::error::Elapsed>),
    Life(Life),
}

struct Session {
    shared: Arc<Shared>,
    life: watch::Receiver<Life>,
    tls: bool,
    helo: bool,
    auth_user: Option<String>,
    txn: Option<Txn>,
    mode: Mode,
    body: Option<BodyReceiver>,
    buf: Vec<u8>,
    out: Vec<u8>,
}

impl Session {
    fn new(shared: Arc<Shared>) -> Self {
        Session {
            life: shared.life.subscribe(),
            shared,
            tls: false,
            helo: false,
            auth_user: None,
            txn: None,
            mode: Mode::Command,
            body: None,
            buf: Vec::new(),
            out: Vec::new(),
        }
    }

    /// RFC 3207: after the handshake the session starts over, and nothing from before counts.
    fn start_tls(&mut self) {
        self.tls = true;
        self.helo = false;
        self.auth_user = None;
        self.txn = None;
        self.mode = Mode::Command;
        self.body = None;
        self.buf.clear();
    }

    fn reply(&mut self, code: u16, text: impl Into<String>) {
        Reply::new(code, text).write_to(&mut self.out);
    }

    fn send(&mut self, reply: &Reply) {
        reply.write_to(&mut self.out);
    }

    async fn flush<S: AsyncWrite + Unpin>(&mut self, stream: &mut S) -> io::Result<()> {
        if !self.out.is_empty() {
            stream.write_all(&self.out).await?;
            stream.flush().await?;
            self.out.clear();
        }
        Ok(())
    }

    fn goodbye(&mut self, life: Life) {
        match life {
            Life::Down(Down::Greet421) => {
                self.reply(421, "4.3.2 Service not available (sink is down)");
            }
            Life::ShuttingDown => self.reply(421, "4.3.2 Sink shutting down"),
            Life::Down(Down::Refuse) | Life::Up => {}
        }
    }

    /// Waits out a fault delay; `false` when the sink went down meanwhile (the goodbye is
    /// queued).
    async fn sleep(&mut self, delay: Duration) -> bool {
        let interrupted = tokio::select! {
            _ = tokio::time::sleep(delay) => None,
            life = went_down(&mut self.life, &self.shared.last_down) => Some(life),
        };
        match interrupted {
            None => true,
            Some(life) => {
                self.goodbye(life);
                false
            }
        }
    }

    async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        stream: &mut S,
        greet: bool,
    ) -> io::Result<End> {
        if greet {
            let flow = self.greeting(stream).await?;
            if !matches!(flow, Flow::Continue) {
                self.flush(stream).await?;
                return Ok(End::Closed);
            }
        }
        loop {
            while let Some(flow) = self.step(stream).await? {
                match flow {
                    Flow::Continue => {}
                    Flow::Close => {
                        self.flush(stream).await?;
                        return Ok(End::Closed);
                    }
                    Flow::StartTls => {
                        self.flush(stream).await?;
                        // Plaintext pipelined after STARTTLS must not leak into the TLS
                        // session (CVE-2011-0411 and kin).
                        self.buf.clear();
                        return Ok(End::StartTls);
                    }
                }
            }
            self.flush(stream).await?;
            // Room for a large read: from an empty Vec, read_buf would grow 64 bytes at a
            // time, many small reads for every large message.
            self.buf.reserve(READ_CHUNK);
            let event = tokio::select! {
                read = tokio::time::timeout(IDLE_TIMEOUT, stream.read_buf(&mut self.buf)) => Event::Read(read),
                life = went_down(&mut self.life, &self.shared.last_down) => Event::Life(life),
            };
            match event {
                Event::Read(Ok(Ok(0))) => return Ok(End::Closed),
                Event::Read(Ok(Ok(_))) => {}
                Event::Read(Ok(Err(err))) => return Err(err),
                Event::Read(Err(_)) => {
                    self.reply(421, "4.4.2 Idle timeout, closing connection");
                    self.flush(stream).await?;
                    return Ok(End::Closed);
                }
                Event::Life(life) => {
                    self.goodbye(life);
                    self.flush(stream).await?;
                    return Ok(End::Closed);
                }
            }
        }
    }

    async fn greeting<S: AsyncWrite + Unpin>(&mut self, stream: &mut S) -> io::Result<Flow> {
        match self.shared.fire(FaultStage::Connect, &Context::default()) {
            // A refused greeting ends the session: the client has nothing useful to say.
            Some(FaultAction::Reply { code, text, .. }) => {
                self.reply(code, text);
                return Ok(Flow::Close);
            }
            Some(FaultAction::Disconnect { .. }) => return Ok(Flow::Close),
            Some(FaultAction::DelayReply { delay, .. }) => {
                if !self.sleep(delay).await {
                    return Ok(Flow::Close);
                }
            }
            Some(FaultAction::DropAfterDot | FaultAction::Webhook(_)) | None => {}
        }
        let hostname = self.shared.config.hostname.clone();
        self.reply(220, format!("{hostname} ESMTP idemrelay sink"));
        self.flush(stream).await?;
        Ok(Flow::Continue)
    }

    /// Applies the rule for `phase`, if one fires. `Some` means the rule answered in place of
    /// the command (or closed); `None` means carry on (after any delay).
    async fn phase_fault<S: AsyncWrite + Unpin>(
        &mut self,
        phase: FaultStage,
        rcpts: &[String],
        stream: &mut S,
    ) -> io::Result<Option<Flow>> {
        let ctx = Context {
            rcpts,
            ..Context::default()
        };
        Ok(match self.shared.fire(phase, &ctx) {
            None | Some(FaultAction::DropAfterDot | FaultAction::Webhook(_)) => None,
            Some(FaultAction::Reply { code, text, .. }) => {
                self.reply(code, text);
                Some(if code == 421 {
                    Flow::Close
                } else {
                    Flow::Continue
                })
            }
            Some(FaultAction::Disconnect { .. }) => Some(Flow::Close),
            Some(FaultAction::DelayReply { delay, .. }) => {
                self.flush(stream).await?;
                if self.sleep(delay).await {
                    None
                } else {
                    Some(Flow::Close)
                }
            }
        })
    }

    /// Handles one unit of buffered input; `None` when more input is needed.
    async fn step<S: AsyncWrite + Unpin>(&mut self, stream: &mut S) -> io::Result<Option<Flow>> {
        if let Some(mut rx) = self.body.take() {
            let (used, status) = rx.feed_dotted(&self.buf);
            self.buf.drain(..used);
            return match status {
                BodyStatus::NeedMore => {
                    self.body = Some(rx);
                    Ok(None)
                }
                BodyStatus::BareLineEnding => {
                    self.reply(521, "5.5.2 Bare CR or LF in message; closing connection");
                    Ok(Some(Flow::Close))
                }
                BodyStatus::Complete => self.end_of_data(rx, stream).await.map(Some),
            };
        }
        match next_piece(&self.buf, MAX_COMMAND_LINE) {
            Piece::NeedMore => Ok(None),
            Piece::BareLineEnding => {
                self.reply(521, "5.5.2 Bare CR or LF in command; closing connection");
                Ok(Some(Flow::Close))
            }
            Piece::Partial(n) => {
                self.buf.drain(..n);
                self.mode = Mode::DiscardLine;
                Ok(Some(Flow::Continue))
            }
            Piece::Line(n) => {
                let line: Vec<u8> = self.buf.drain(..n).collect();
                let content = &line[..n - 2];
                match std::mem::replace(&mut self.mode, Mode::Command) {
                    Mode::Command => self.command(&line, stream).await.map(Some),
                    Mode::DiscardLine => {
                        self.reply(500, "5.5.2 Line too long");
                        Ok(Some(Flow::Continue))
                    }
                    Mode::Sasl(mut exchange) => {
                        let step = exchange.next(&String::from_utf8_lossy(content));
                        self.sasl_step(exchange, step);
                        Ok(Some(Flow::Continue))
                    }
                }
            }
        }
    }

    async fn command<S: AsyncWrite + Unpin>(
        &mut self,
        line: &[u8],
        stream: &mut S,
    ) -> io::Result<Flow> {
        let request = match Request::parse(&mut line.iter()) {
            Ok(request) => request.into_owned(),
            Err(err) => {
                let (code, text) = match err {
                    ProtoError::UnknownCommand => (500, "5.5.1 Unknown command".to_string()),
                    ProtoError::InvalidSenderAddress => (501, "5.1.7 Bad sender address".into()),
                    ProtoError::InvalidRecipientAddress => {
                        (501, "5.1.3 Bad recipient address".into())
                    }
                    ProtoError::UnsupportedParameter { param } => {
                        (555, format!("5.5.4 Unsupported parameter {param}"))
                    }
                    ProtoError::SyntaxError { syntax } => (501, format!("5.5.4 Syntax: {syntax}")),
                    other => (501, format!("5.5.4 Syntax error ({other:?})")),
                };
                self.reply(code, text);
                return Ok(Flow::Continue);
            }
        };
        match request {
            Request::Ehlo { host } => self.hello(&host, true, stream).await,
            Request::Helo { host } => self.hello(&host, false, stream).await,
            Request::Mail { from } => self.mail(from, raw_command(line), stream).await,
            Request::Rcpt { to } => self.rcpt(to, raw_command(line), stream).await,
            Request::Data => self.data(stream).await,
            Request::Rset => {
                self.txn = None;
                self.reply(250, "2.0.0 OK");
                Ok(Flow::Continue)
            }
            Request::Noop { .. } => {
                self.reply(250, "2.0.0 OK");
                Ok(Flow::Continue)
            }
            Request::Quit => {
                self.reply(221, "2.0.0 Bye");
                Ok(Flow::Close)
            }
            Request::StartTls => Ok(self.starttls()),
            Request::Auth {
                mechanism,
                initial_response,
            } => {
                self.auth(mechanism, &initial_response);
                Ok(Flow::Continue)
            }
            Request::Vrfy { .. } => {
                self.reply(252, "2.5.0 Cannot VRFY user");
                Ok(Flow::Continue)
            }
            other => {
                self.reply(502, format!("5.5.1 {} not implemented", other.name()));
                Ok(Flow::Continue)
            }
        }
    }

    async fn hello<S: AsyncWrite + Unpin>(
        &mut self,
        host: &str,
        esmtp: bool,
        stream: &mut S,
    ) -> io::Result<Flow> {
        if let Some(flow) = self.phase_fault(FaultStage::Ehlo, &[], stream).await? {
            return Ok(flow);
        }
        self.txn = None;
        self.helo = true;
        let hostname = &self.shared.config.hostname;
        if !esmtp {
            self.reply(250, hostname.clone());
            return Ok(Flow::Continue);
        }
        let mut lines = vec![
            format!("{hostname} greets {host}"),
            "PIPELINING".into(),
            "8BITMIME".into(),
            "SMTPUTF8".into(),
            "ENHANCEDSTATUSCODES".into(),
            format!("SIZE {}", self.shared.config.max_message_size),
        ];
        if self.shared.tls.is_some() && !self.tls {
            lines.push("STARTTLS".into());
        }
        if self.shared.config.require_auth.is_some() {
            lines.push("AUTH PLAIN LOGIN".into());
        }
        if self.shared.config.dsn {
            lines.push("DSN".into());
        }
        // RFC 8689 §4.1: offered only once the session is under TLS.
        if self.shared.config.requiretls && self.tls {
            lines.push("REQUIRETLS".into());
        }
        self.send(&Reply::multi(250, lines));
        Ok(Flow::Continue)
    }

    async fn mail<S: AsyncWrite + Unpin>(
        &mut self,
        from: MailFrom<String>,
        mail_command: String,
        stream: &mut S,
    ) -> io::Result<Flow> {
        if !self.helo {
            self.reply(503, "5.5.1 Send EHLO first");
            return Ok(Flow::Continue);
        }
        if self.shared.config.require_auth.is_some() && self.auth_user.is_none() {
            self.reply(530, "5.7.0 Authentication required");
            return Ok(Flow::Continue);
        }
        if self.txn.is_some() {
            self.reply(503, "5.5.1 Nested MAIL command");
            return Ok(Flow::Continue);
        }
        if let Some(flow) = self.phase_fault(FaultStage::Mail, &[], stream).await? {
            return Ok(flow);
        }
        if from.flags & MAIL_BODY_BINARYMIME != 0 {
            self.reply(555, "5.5.4 BODY=BINARYMIME not supported");
            return Ok(Flow::Continue);
        }
        if from.size > self.shared.config.max_message_size {
            self.reply(552, "5.3.4 Message size exceeds fixed maximum");
            return Ok(Flow::Continue);
        }
        let dsn = from.flags & (MAIL_RET_FULL | MAIL_RET_HDRS) != 0 || from.env_id.is_some();
        if dsn && !self.shared.config.dsn {
            self.reply(555, "5.5.4 DSN parameters not supported");
            return Ok(Flow::Continue);
        }
        if from.flags & MAIL_REQUIRETLS != 0 && !(self.shared.config.requiretls && self.tls) {
            self.reply(555, "5.5.4 REQUIRETLS not supported");
            return Ok(Flow::Continue);
        }
        self.txn = Some(Txn {
            mail_from: from.address,
            eightbitmime: from.flags & MAIL_BODY_8BITMIME != 0,
            smtputf8: from.flags & MAIL_SMTPUTF8 != 0,
            rcpt_to: Vec::new(),
            mail_command,
            rcpt_commands: Vec::new(),
        });
        self.reply(250, "2.1.0 Sender OK");
        Ok(Flow::Continue)
    }

    async fn rcpt<S: AsyncWrite + Unpin>(
        &mut self,
        to: RcptTo<String>,
        rcpt_command: String,
        stream: &mut S,
    ) -> io::Result<Flow> {
        if self.txn.is_none() {
            self.reply(503, "5.5.1 Send MAIL first");
            return Ok(Flow::Continue);
        }
        let notify =
            RCPT_NOTIFY_SUCCESS | RCPT_NOTIFY_FAILURE | RCPT_NOTIFY_DELAY | RCPT_NOTIFY_NEVER;
        if (to.flags & notify != 0 || to.orcpt.is_some()) && !self.shared.config.dsn {
            self.reply(555, "5.5.4 DSN parameters not supported");
            return Ok(Flow::Continue);
        }
        let address = [to.address];
        if let Some(flow) = self.phase_fault(FaultStage::Rcpt, &address, stream).await? {
            return Ok(flow);
        }
        let [address] = address;
        let Some(txn) = self.txn.as_mut() else {
            return Ok(Flow::Continue);
        };
        if txn.rcpt_to.len() >= MAX_RECIPIENTS {
            self.reply(452, "4.5.3 Too many recipients");
            return Ok(Flow::Continue);
        }
        txn.rcpt_commands.push(rcpt_command);
        if !txn.rcpt_to.contains(&address) {
            txn.rcpt_to.push(address);
        }
        self.reply(250, "2.1.5 Recipient OK");
        Ok(Flow::Continue)
    }

    async fn data<S: AsyncWrite + Unpin>(&mut self, stream: &mut S) -> io::Result<Flow> {
        let rcpts = match &self.txn {
            None => {
                self.reply(503, "5.5.1 Send MAIL first");
                return Ok(Flow::Continue);
            }
            Some(txn) if txn.rcpt_to.is_empty() => {
                self.reply(554, "5.5.1 No valid recipients");
                return Ok(Flow::Continue);
            }
            Some(txn) => txn.rcpt_to.clone(),
        };
        if let Some(flow) = self.phase_fault(FaultStage::Data, &rcpts, stream).await? {
            return Ok(flow);
        }
        self.body = Some(BodyReceiver::new(BodyLimits {
            max_line: MAX_DATA_LINE,
            max_size: self.shared.config.max_message_size,
        }));
        self.reply(354, "Start mail input; end with <CRLF>.<CRLF>");
        Ok(Flow::Continue)
    }

    async fn end_of_data<S: AsyncWrite + Unpin>(
        &mut self,
        rx: BodyReceiver,
        stream: &mut S,
    ) -> io::Result<Flow> {
        let Some(txn) = self.txn.take() else {
            return Ok(Flow::Close);
        };
        let body_fault = rx.fault();
        let bytes = rx.into_message().unwrap_or_default();
        let key = read_key(&bytes);
        let plan = self
            .shared
            .dot(DotHandover {
                key,
                mail_from: txn.mail_from,
                rcpt_to: txn.rcpt_to,
                eightbitmime: txn.eightbitmime,
                smtputf8: txn.smtputf8,
                bytes,
                body_fault,
                tls: self.tls,
                auth_user: self.auth_user.clone(),
                mail_command: txn.mail_command,
                rcpt_commands: txn.rcpt_commands,
            })
            .await;
        if let Some(delay) = plan.delay {
            self.flush(stream).await?;
            let awake = self.sleep(delay).await;
            // The operation is over once its reply exists, whether or not the client is
            // still there to read it.
            drop(plan.running);
            if !awake {
                return Ok(Flow::Close);
            }
        }
        match plan.reply {
            None => Ok(Flow::Close),
            Some(reply) => {
                self.send(&reply);
                Ok(if reply.code == 421 {
                    Flow::Close
                } else {
                    Flow::Continue
                })
            }
        }
    }

    fn starttls(&mut self) -> Flow {
        if self.shared.tls.is_none() || self.tls {
            self.reply(502, "5.5.1 STARTTLS not available");
            return Flow::Continue;
        }
        self.reply(220, "2.0.0 Ready to start TLS");
        Flow::StartTls
    }

    fn auth(&mut self, mechanism: u64, initial: &str) {
        let mechanism = match mechanism {
            AUTH_PLAIN => Some(SaslMechanism::Plain),
            AUTH_LOGIN => Some(SaslMechanism::Login),
            _ => None,
        };
        if self.shared.config.require_auth.is_none() {
            self.reply(502, "5.5.1 AUTH not available");
        } else if !self.helo {
            self.reply(503, "5.5.1 Send EHLO first");
        } else if self.auth_user.is_some() {
            self.reply(503, "5.5.1 Already authenticated");
        } else if self.txn.is_some() {
            self.reply(503, "5.5.1 AUTH not allowed during a mail transaction");
        } else if let Some(mechanism) = mechanism {
            let initial = (!initial.is_empty()).then_some(initial);
            let (exchange, step) = SaslExchange::start(mechanism, initial);
            self.sasl_step(exchange, step);
        } else {
            self.reply(504, "5.5.4 Unrecognized authentication type");
        }
    }

    fn sasl_step(&mut self, exchange: SaslExchange, step: SaslStep) {
        match step {
            SaslStep::Challenge(challenge) => {
                self.mode = Mode::Sasl(exchange);
                self.reply(334, challenge);
            }
            SaslStep::Done(presented) => {
                self.check_credentials(&presented.user, &presented.password)
            }
            SaslStep::Malformed => self.reply(501, "5.5.2 Cannot decode the response"),
            SaslStep::Cancelled => self.reply(501, "5.0.0 Authentication cancelled"),
        }
    }

    fn check_credentials(&mut self, user: &str, pass: &str) {
        let ok = self
            .shared
            .config
            .require_auth
            .as_ref()
            .is_some_and(|(u, p)| u == user && p == pass);
        if ok {
            tracing::debug!(user, "sink AUTH succeeded");
            self.auth_user = Some(user.to_string());
            self.reply(235, "2.7.0 Authentication successful");
        } else {
            tracing::info!(user, "sink AUTH failed");
            self.reply(535, "5.7.8 Authentication credentials invalid");
        }
    }
}
