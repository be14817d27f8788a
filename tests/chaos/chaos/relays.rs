//! The relays: their users and config, the cluster that kills and restarts them, the webhook
//! balancer in front of them, and the storm.

use super::*;

/// The users of [`USERS`], with cheap argon2 parameters: `AUTH` verifies with the parameters
/// of the stored hash, and the default ones (19 MiB, two passes) would put hundreds of such
/// runs per scenario on the test's two cores, one per login.
pub(super) fn write_users(path: &Path) {
    use argon2::CustomizedPasswordHasher as _;
    for (name, password, scope) in USERS {
        idemrelay::auth::Users::add_user(path, name, password, scope, &[]).unwrap();
        let params = argon2::Params::new(8, 1, 1, None).unwrap();
        let cheap = argon2::Argon2::default()
            .hash_password_with_params(password.as_bytes(), b"chaos-test-salt", params)
            .unwrap()
            .to_string();
        // The hash just written is the one with other parameters than the cheap ones.
        let text = std::fs::read_to_string(path).unwrap();
        let costly = text
            .split('"')
            .find(|s| s.starts_with("$argon2") && !s.contains("$m=8,t=1,p=1$"))
            .unwrap_or_else(|| panic!("no new hash for {name} in {text}"))
            .to_string();
        std::fs::write(path, text.replace(&costly, &cheap)).unwrap();
    }
}

pub(super) fn write_config(path: &Path, users: &Path) {
    // Every phase is listed: `[delivery.timeouts]` does not accept a partial table.
    let text = format!(
        r#"
users_file = "{}"
webhook_listen = "127.0.0.1:0"
in_progress_wait = "1s"
store_busy_timeout = "700ms"
store_probe_interval = "200ms"

[delivery]
connections = 3
scan_interval = "50ms"
retry_base = "50ms"
retry_cap = "400ms"
max_attempts = 100000
rate = 2000.0
burst = 2000.0
breaker_threshold = 100000
breaker_cooldown = "100ms"
upstream_window = "{}s"
window_margin = "{}s"

[delivery.timeouts]
connect = "2s"
greeting = "2s"
starttls = "2s"
auth = "2s"
mail = "2s"
rcpt = "2s"
data = "2s"
dot = "{DOT_TIMEOUT}"

# The sink's event shape (docs/guides/sink.md "Its webhooks").
[webhooks.{HOOK_SOURCE}]
secrets = ["{HOOK_SECRET}"]
[webhooks.{HOOK_SOURCE}.fields]
event_type = "/type"
event_time = "/timestamp"
key = "/idempotency_key"
upstream_id = "/message_id"
message_id = "/headers/message-id"
recipient = "/rcpt_to"
[webhooks.{HOOK_SOURCE}.types]
accepted = ["injection", "delivery"]
bounced = ["bounce"]
"#,
        users.display(),
        WINDOW.as_secs(),
        MARGIN.as_secs()
    );
    std::fs::write(path, text).unwrap();
}

#[derive(Debug, Default)]
pub(super) struct Deaths {
    pub(super) sigkill: usize,
    pub(super) failpoints: BTreeMap<String, usize>,
    /// Deaths nobody asked for (a panic, an exit): always a failure.
    pub(super) unexpected: Vec<String>,
}

/// The relay instances of a scenario, restarted on the same store whenever one dies.
pub(super) struct Cluster {
    pub(super) store_url: String,
    pub(super) config: PathBuf,
    pub(super) upstream: SocketAddr,
    pub(super) failpoints: String,
    pub(super) seed: u64,
    pub(super) relays: Vec<Option<RelayProcess>>,
    pub(super) addrs: Addrs,
    /// The webhook listeners of the relays that are up, for the balancer.
    pub(super) hooks: Addrs,
    pub(super) incarnations: u64,
    pub(super) deaths: Deaths,
    /// The logs of dead relays, for failure messages.
    pub(super) dead_logs: Vec<String>,
}

pub(super) fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Cluster {
    pub(super) async fn start(
        store_url: String,
        config: PathBuf,
        upstream: SocketAddr,
        instances: usize,
        failpoints: String,
        seed: u64,
    ) -> Cluster {
        let mut cluster = Cluster {
            store_url,
            config,
            upstream,
            failpoints,
            seed,
            relays: (0..instances).map(|_| None).collect(),
            addrs: Arc::new(Mutex::new(vec![None; instances])),
            hooks: Arc::new(Mutex::new(vec![None; instances])),
            incarnations: 0,
            deaths: Deaths::default(),
            dead_logs: Vec::new(),
        };
        // Spawned together: on Postgres they run the migrations concurrently.
        let spawned: Vec<RelayProcess> = (0..instances).map(|_| cluster.spawn()).collect();
        for (i, relay) in spawned.into_iter().enumerate() {
            cluster.install(i, relay).await;
        }
        cluster
    }

    pub(super) fn spawn(&mut self) -> RelayProcess {
        self.incarnations += 1;
        let args: Vec<String> = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--hostname",
            "relay.test",
            "--store",
            &self.store_url,
            "--config",
            &self.config.display().to_string(),
            "--upstream",
            &format!("smtp://{}?tls=none", self.upstream),
            // Two instances on one host: each its own admin port.
            "--admin",
            "127.0.0.1:0",
        ]
        .map(String::from)
        .to_vec();
        let env = [
            ("IDEMRELAY_FAILPOINTS", self.failpoints.clone()),
            (
                "IDEMRELAY_FAILPOINT_SEED",
                format!("{:#x}", mix(self.seed, self.incarnations)),
            ),
        ];
        RelayProcess::spawn_with_env(&args, &env)
    }

    pub(super) async fn install(&mut self, i: usize, relay: RelayProcess) {
        let relay = relay.ready().await;
        self.addrs.lock().unwrap()[i] = Some(relay.addr);
        self.hooks.lock().unwrap()[i] = Some(relay.webhooks());
        self.relays[i] = Some(relay);
    }

    /// Notes why a relay died and starts another on the same store.
    pub(super) async fn buried(
        &mut self,
        i: usize,
        relay: RelayProcess,
        status: std::process::ExitStatus,
    ) {
        use std::os::unix::process::ExitStatusExt;
        // The log is collected by a thread that may not yet have drained the pipe when the
        // exit is seen, and a crash point's line is the last one: without this wait, a busy
        // relay's abort could be taken for a death nobody asked for.
        let settle = Instant::now() + Duration::from_secs(3);
        let log = loop {
            let log = relay.log();
            if status.signal() == Some(9)
                || log.contains(" fired: aborting\n")
                || Instant::now() >= settle
            {
                break log;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        drop(relay);
        let fired = log.lines().rev().find_map(|l| {
            l.strip_prefix("failpoint ")
                .and_then(|rest| rest.strip_suffix(" fired: aborting"))
        });
        match (status.signal(), fired) {
            (Some(6), Some(name)) => *self.deaths.failpoints.entry(name.into()).or_default() += 1,
            (Some(9), _) => self.deaths.sigkill += 1,
            _ => self.deaths.unexpected.push(format!(
                "relay {i} died on its own ({status}):\n{}",
                tail(&log, 40)
            )),
        }
        self.dead_logs.push(log);
        let relay = self.spawn();
        self.install(i, relay).await;
    }

    /// Restarts every relay that has died by itself since the last look.
    pub(super) async fn reap(&mut self) {
        for i in 0..self.relays.len() {
            let status = self.relays[i].as_mut().and_then(RelayProcess::try_exit);
            if let Some(status) = status {
                self.addrs.lock().unwrap()[i] = None;
                self.hooks.lock().unwrap()[i] = None;
                let relay = self.relays[i].take().unwrap();
                self.buried(i, relay, status).await;
            }
        }
    }

    pub(super) async fn sigkill(&mut self, i: usize) {
        self.addrs.lock().unwrap()[i] = None;
        self.hooks.lock().unwrap()[i] = None;
        let mut relay = self.relays[i].take().expect("relay running");
        // Signalled like an operator would, so that a relay that aborted at a crash point a
        // moment earlier is simply found dead (and counted as such).
        relay.signal("KILL");
        let status = relay.wait_exit(Duration::from_secs(10)).await;
        self.buried(i, relay, status).await;
    }

    /// Every log line that names `id`, from all relays so far.
    pub(super) fn lines_about(&self, id: &str) -> String {
        self.dead_logs
            .iter()
            .flat_map(|log| log.lines())
            .filter(|l| l.contains(id))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub(super) fn logs(&self) -> String {
        let mut out = String::new();
        for (i, log) in self.dead_logs.iter().rev().take(3).enumerate() {
            let log = tail(log, 40);
            out.push_str(&format!("--- dead relay log (last but {i}) ---\n{log}\n"));
        }
        for relay in self.relays.iter().flatten() {
            out.push_str(&format!(
                "--- live relay log ---\n{}\n",
                tail(&relay.log(), 40)
            ));
        }
        out
    }
}

/// What the balancer in front of the relays' webhook listeners did.
#[derive(Debug, Default)]
pub(super) struct Balanced {
    /// Connections passed on, per relay instance.
    pub(super) per_relay: Vec<u64>,
    /// Connections closed at once: no relay was up, or the one picked refused.
    pub(super) closed: u64,
}

/// The relays' webhook listeners behind one address, as a load balancer in TCP mode puts
/// them (the sink is told one URL; the relays move to new ports when restarted): each
/// connection goes to the next relay that is up, round robin, and is closed at once when none
/// is, so that the sink retries.
pub(super) async fn balance(listener: TcpListener, hooks: Addrs, counts: Arc<Mutex<Balanced>>) {
    let mut next = 0usize;
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        let picked = {
            let hooks = hooks.lock().unwrap();
            let n = hooks.len();
            (0..n).find_map(|i| hooks[(next + i) % n].map(|addr| ((next + i) % n, addr)))
        };
        next = next.wrapping_add(1);
        let counts = counts.clone();
        tokio::spawn(async move {
            let outbound = match picked {
                Some((i, addr)) => {
                    tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .map(|s| (i, s))
                }
                None => None,
            };
            let Some((i, mut outbound)) = outbound else {
                counts.lock().unwrap().closed += 1;
                return;
            };
            {
                let mut counts = counts.lock().unwrap();
                if counts.per_relay.len() <= i {
                    counts.per_relay.resize(i + 1, 0);
                }
                counts.per_relay[i] += 1;
            }
            // A relay killed in the middle of a request breaks both halves: the sender sees
            // no answer, as it would behind a real balancer.
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        });
    }
}

#[derive(Debug, Default)]
pub(super) struct Storm {
    pub(super) store_locks: usize,
    pub(super) sink_bursts: usize,
}

/// Adds a rule behind the ones still active, keeping what is left of each count (the rules
/// are replaced as a whole).
pub(super) fn add_sink_rule(sink: &SinkHandle, rule: FaultRule) {
    let mut rules: Vec<FaultRule> = sink
        .faults()
        .into_iter()
        .filter_map(|s| match s.rule.times {
            Some(t) if s.fired >= t => None,
            Some(t) => Some(s.rule.with_times(t - s.fired)),
            None => Some(s.rule),
        })
        .collect();
    rules.push(rule);
    sink.set_faults(rules).unwrap();
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Clients submitting: kills, locks and bursts on a seeded schedule.
    Storm,
    /// Clients done: only the crash points still fire; dead relays are still restarted.
    Drain,
    Stop,
}

/// Watches the relays (restarting the dead) and, during the storm, injects the faults.
pub(super) async fn chaos(
    mut cluster: Cluster,
    sink: SinkHandle,
    seed: u64,
    stage: watch::Receiver<Stage>,
) -> (Cluster, Storm) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut storm = Storm::default();
    let mut next = Instant::now() + Duration::from_millis(rng.u64(200..600));
    loop {
        cluster.reap().await;
        let current = *stage.borrow();
        match current {
            Stage::Stop => return (cluster, storm),
            Stage::Drain => {}
            Stage::Storm if Instant::now() >= next => {
                match rng.u32(0..100) {
                    0..40 => {
                        let i = rng.usize(0..cluster.relays.len());
                        cluster.sigkill(i).await;
                    }
                    40..65 => {
                        let lock = WriteLock::hold(&cluster.store_url).await;
                        tokio::time::sleep(Duration::from_millis(rng.u64(500..1500))).await;
                        lock.release().await;
                        storm.store_locks += 1;
                    }
                    65..85 => {
                        let times = rng.u32(5..25);
                        add_sink_rule(
                            &sink,
                            FaultRule::reply(FaultStage::Mail, 451, "4.3.0 chaos burst")
                                .with_times(times),
                        );
                        storm.sink_bursts += 1;
                    }
                    _ => {
                        let times = rng.u32(3..10);
                        add_sink_rule(
                            &sink,
                            FaultRule::reply(FaultStage::Connect, 421, "4.3.2 chaos burst")
                                .with_times(times),
                        );
                        storm.sink_bursts += 1;
                    }
                }
                next = Instant::now() + Duration::from_millis(rng.u64(300..1200));
            }
            Stage::Storm => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
