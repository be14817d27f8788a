//! The built relay binary as a child process: started on 127.0.0.1:0, its port read from the
//! `listening on` log line, SIGKILLed when dropped so a failing test leaves nothing behind.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_idemrelay");
pub const STARTUP: Duration = Duration::from_secs(30);

/// `idemrelay` with a clean environment: a developer's IDEMRELAY_* exports must not change
/// what is tested.
pub fn idemrelay() -> Command {
    let mut cmd = Command::new(BIN);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("IDEMRELAY_") {
            cmd.env_remove(name);
        }
    }
    // Never the host's own /etc/idemrelay/idemrelay.toml: a test names its settings.
    cmd.env("IDEMRELAY_DEFAULT_CONFIG", "");
    cmd
}

pub fn store_url(db: &Path) -> String {
    format!("sqlite://{}", db.display())
}

/// `serve` on port 0 with the test hostname and this store, then `extra`.
pub fn serve_args(db: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--hostname",
        "relay.test",
        "--admin",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    args.push("--store".into());
    args.push(store_url(db));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

pub struct RelayProcess {
    child: Child,
    pub addr: SocketAddr,
    /// Everything the relay wrote to stderr so far, for failure messages.
    log: Arc<Mutex<String>>,
    port: mpsc::Receiver<SocketAddr>,
}

/// `... admin API at http://127.0.0.1:PORT/` → the address (None without that line).
pub fn admin_addr(log: &str) -> Option<SocketAddr> {
    log.lines().find_map(|line| {
        let rest = &line[line.find("admin API at http://")? + "admin API at http://".len()..];
        rest.split(['/', '"', ' ']).next()?.parse().ok()
    })
}

/// `... webhooks at http://127.0.0.1:PORT/webhooks/{name} for ...` → the address (None
/// without `webhook_listen`).
pub fn webhook_addr(log: &str) -> Option<SocketAddr> {
    log.lines().find_map(|line| {
        let rest = &line[line.find("webhooks at http://")? + "webhooks at http://".len()..];
        rest.split(['/', '"', ' ']).next()?.parse().ok()
    })
}

impl RelayProcess {
    /// Starts the process; `wait_ready` or `ready` waits for its port.
    pub fn spawn(args: &[String]) -> RelayProcess {
        RelayProcess::spawn_command(idemrelay(), args)
    }

    /// `spawn` with these variables added to the cleaned environment.
    pub fn spawn_with_env(args: &[String], env: &[(&str, String)]) -> RelayProcess {
        let mut cmd = idemrelay();
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        RelayProcess::spawn_command(cmd, args)
    }

    /// `spawn` with a command prepared by the caller (extra environment variables).
    pub fn spawn_command(mut cmd: Command, args: &[String]) -> RelayProcess {
        let mut child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn idemrelay");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(String::new()));
        let (port_tx, port) = mpsc::channel();
        let sink = log.clone();
        // The reader keeps draining after the port line, or a chatty relay would block on a
        // full pipe; it ends by itself when the process closes stderr.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let addr = listening_addr(&line);
                {
                    let mut log = sink.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
                if let Some(addr) = addr {
                    let _ = port_tx.send(addr);
                }
            }
        });
        RelayProcess {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            port,
        }
    }

    /// Blocks until the relay reports its port (for plain tests; async tests use `ready`).
    pub fn wait_ready(mut self) -> RelayProcess {
        // Disconnected (the relay exited before listening) fails at once instead of waiting.
        match self.port.recv_timeout(STARTUP) {
            Ok(addr) => self.addr = addr,
            Err(err) => panic!(
                "relay did not report `listening on` ({err}); stderr:\n{}",
                self.log()
            ),
        }
        self
    }

    /// Waits for the port without blocking the runtime (an in-process sink may share it).
    pub async fn ready(mut self) -> RelayProcess {
        let started = Instant::now();
        loop {
            match self.port.try_recv() {
                Ok(addr) => {
                    self.addr = addr;
                    return self;
                }
                Err(mpsc::TryRecvError::Empty) if started.elapsed() < STARTUP => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(err) => panic!(
                    "relay did not report `listening on` ({err:?}); stderr:\n{}",
                    self.log()
                ),
            }
        }
    }

    /// The relay's resident memory now (VmRSS from /proc), in bytes.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("read /proc/PID/status");
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS in {status}"));
        kb * 1024
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The admin API's address, from the log (written before the SMTP listeners' lines).
    pub fn admin(&self) -> SocketAddr {
        admin_addr(&self.log()).unwrap_or_else(|| panic!("no admin API line:\n{}", self.log()))
    }

    /// The webhook listener's address, from the log (written before the SMTP listeners'
    /// lines, so it is there once the relay is `ready`).
    pub fn webhooks(&self) -> SocketAddr {
        webhook_addr(&self.log())
            .unwrap_or_else(|| panic!("no webhook listener line:\n{}", self.log()))
    }

    /// Sends a signal the way an operator would (`kill -TERM pid`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed: {status}");
    }

    /// Waits for the process to end; panics with the relay's log if it outlives `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "relay still running {within:?} after being told to stop; stderr:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The exit status if the process has ended by itself (e.g. a failpoint's abort).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// SIGKILL: nothing of the relay runs after this returns. Returns its log.
    pub fn kill(mut self) -> String {
        self.child.kill().expect("SIGKILL the relay");
        let status = self.child.wait().expect("reap the relay");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status}");
        self.log()
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `... INFO idemrelay::app: listening on 127.0.0.1:PORT (Plain)` → the address.
pub fn listening_addr(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find("listening on ")? + "listening on ".len()..];
    rest.split_whitespace().next()?.parse().ok()
}
