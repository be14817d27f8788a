//! The PostgreSQL server binaries (run as the postgres user when we are root), and the
//! two clusters: a primary and its standby, with synchronous or asynchronous replication.

use super::*;

pub(super) struct PgBin {
    pub(super) dir: PathBuf,
    /// initdb and the server refuse to run as root: as root, every tool runs through
    /// `runuser -u postgres`.
    pub(super) as_postgres: bool,
}

impl PgBin {
    /// The newest /usr/lib/postgresql/*/bin with the three tools, or why there is none.
    pub(super) fn find() -> Result<PgBin, String> {
        let root = Path::new("/usr/lib/postgresql");
        let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
            .map_err(|e| format!("{}: {e}", root.display()))?
            .filter_map(Result::ok)
            .filter_map(|e| {
                let version = e.file_name().to_str()?.parse().ok()?;
                let bin = e.path().join("bin");
                ["initdb", "pg_ctl", "pg_basebackup"]
                    .iter()
                    .all(|t| bin.join(t).is_file())
                    .then_some((version, bin))
            })
            .collect();
        found.sort();
        let (_, dir) = found.pop().ok_or_else(|| {
            format!(
                "no initdb, pg_ctl and pg_basebackup in {}/*/bin",
                root.display()
            )
        })?;
        let as_postgres = std::fs::metadata("/proc/self")
            .map_err(|e| format!("/proc/self: {e}"))?
            .uid()
            == 0;
        if as_postgres {
            let known = Command::new("id")
                .args(["-u", "postgres"])
                .output()
                .is_ok_and(|o| o.status.success());
            if !known {
                return Err(
                    "running as root and there is no `postgres` user to run the server as".into(),
                );
            }
        }
        Ok(PgBin { dir, as_postgres })
    }

    pub(super) fn command(&self, tool: &str) -> Command {
        let path = self.dir.join(tool);
        if self.as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(path);
            cmd
        } else {
            Command::new(path)
        }
    }

    pub(super) fn run(&self, tool: &str, args: &[&str]) {
        let out = self
            .command(tool)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{tool}: {e}"));
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

// --- the two clusters -------------------------------------------------------------------------

pub(super) struct Cluster {
    pub(super) data: PathBuf,
    pub(super) port: u16,
}

impl Cluster {
    pub(super) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub(super) fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The postmaster and its children (backends, walsender or walreceiver, ...).
    pub(super) fn processes(&self) -> Vec<u32> {
        let Ok(pid_file) = std::fs::read_to_string(self.data.join("postmaster.pid")) else {
            return Vec::new();
        };
        let Some(postmaster) = pid_file.lines().next().and_then(|l| l.trim().parse().ok()) else {
            return Vec::new();
        };
        // A postmaster killed with -9 leaves its pid file behind.
        if !Path::new(&format!("/proc/{postmaster}")).exists() {
            return Vec::new();
        }
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`: comm may hold spaces, so read after the last `)`.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            if ppid == Some(postmaster) {
                pids.push(pid);
            }
        }
        pids
    }

    /// A postmaster killed with -9 leaves its pid file and its small System V shared memory
    /// segment behind; a next start in the same data directory would remove the segment, but
    /// the directory is about to go, so it is removed here (line 7 of the pid file: key, id).
    pub(super) fn remove_orphaned_segment(&self) {
        if !self.processes().is_empty() {
            return;
        }
        let Ok(pid_file) = std::fs::read_to_string(self.data.join("postmaster.pid")) else {
            return;
        };
        if let Some(id) = pid_file
            .lines()
            .nth(6)
            .and_then(|l| l.split_whitespace().nth(1))
        {
            let _ = Command::new("ipcrm")
                .args(["-m", id])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }

    /// Sends `signal` to the postmaster and its children, in one `kill`; returns how many.
    pub(super) fn signal_all(&self, signal: &str) -> usize {
        let pids = self.processes();
        if !pids.is_empty() {
            // A child may have exited meanwhile (a backend whose client left).
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .args(pids.iter().map(u32::to_string))
                .stderr(std::process::Stdio::null())
                .status();
        }
        pids.len()
    }
}

/// The primary and its standby; stopped when dropped, before their tempdir goes.
pub(super) struct Pair {
    pub(super) bin: PgBin,
    pub(super) primary: Cluster,
    pub(super) standby: Cluster,
    pub(super) _dir: tempfile::TempDir,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for cluster in [&self.standby, &self.primary] {
            if !cluster.processes().is_empty() {
                let _ = self
                    .bin
                    .command("pg_ctl")
                    .arg("-D")
                    .arg(&cluster.data)
                    .args(["-m", "immediate", "-w", "-t", "20", "stop"])
                    .output();
            }
            cluster.remove_orphaned_segment();
        }
    }
}

pub(super) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(super) fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Replication {
    /// `synchronous_standby_names` names the standby: a commit returns once the standby has
    /// flushed it (`synchronous_commit = on`, which the relay sets on its connections).
    Synchronous,
    /// No synchronous standby: a commit returns once it is on the primary's disk.
    Asynchronous,
}

/// Makes, starts and connects the two clusters.
pub(super) async fn start_pair(bin: PgBin, replication: Replication) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    if bin.as_postgres {
        let owner = Command::new("id")
            .args(["-u", "postgres"])
            .output()
            .unwrap();
        let uid: u32 = String::from_utf8_lossy(&owner.stdout)
            .trim()
            .parse()
            .unwrap();
        std::os::unix::fs::chown(dir.path(), Some(uid), None).unwrap();
    }
    let socket_dir = dir.path().display().to_string();
    let primary = Cluster {
        data: dir.path().join("primary"),
        port: free_port(),
    };
    let standby = Cluster {
        data: dir.path().join("standby"),
        port: free_port(),
    };
    let data = |c: &Cluster| c.data.display().to_string();
    bin.run(
        "initdb",
        &[
            "-D",
            &data(&primary),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            // Only initdb's own files go unsynced (the drill's data is made afterwards); the
            // servers keep fsync on, which the promise rests on.
            "--no-sync",
        ],
    );
    let sync_names = match replication {
        Replication::Synchronous => "standby",
        Replication::Asynchronous => "",
    };
    append(
        &primary.data.join("postgresql.conf"),
        &format!(
            "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{socket_dir}'\n\
             wal_level = replica\nmax_wal_senders = 4\nfsync = on\n\
             synchronous_standby_names = '{sync_names}'\nsynchronous_commit = on\n",
            primary.port
        ),
    );
    append(
        &primary.data.join("pg_hba.conf"),
        "\nhost replication all 127.0.0.1/32 trust\n",
    );
    let pair = Pair {
        bin,
        primary,
        standby,
        _dir: dir,
    };
    let (bin, primary, standby) = (&pair.bin, &pair.primary, &pair.standby);
    let log = |c: &Cluster| c.data.with_extension("log").display().to_string();
    bin.run(
        "pg_ctl",
        &[
            "-D",
            &data(primary),
            "-l",
            &log(primary),
            "-w",
            "-t",
            "30",
            "start",
        ],
    );
    // -R writes primary_conninfo with this application_name, the name
    // synchronous_standby_names waits for.
    bin.run(
        "pg_basebackup",
        &[
            "-d",
            &format!(
                "host=127.0.0.1 port={} user=postgres application_name=standby",
                primary.port
            ),
            "-D",
            &data(standby),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        ],
    );
    // The base backup copied the primary's settings; the standby gets its own port. Once
    // promoted it has no standby of its own, and naming one would make every commit wait
    // for a server that does not exist: a failover tool clears (or repoints) this setting,
    // here it is cleared in advance (it has no effect while the server is a standby). With
    // its primary gone, a standby retries the connection every wal_retrieve_retry_interval
    // (5 s by default), and a promotion asked meanwhile could wait that long.
    append(
        &standby.data.join("postgresql.conf"),
        &format!(
            "\nport = {}\nsynchronous_standby_names = ''\nwal_retrieve_retry_interval = '200ms'\n",
            standby.port
        ),
    );
    bin.run(
        "pg_ctl",
        &[
            "-D",
            &data(standby),
            "-l",
            &log(standby),
            "-w",
            "-t",
            "30",
            "start",
        ],
    );
    // Streaming, and (synchronous drill) the standby every commit waits for.
    let want = match replication {
        Replication::Synchronous => "sync",
        Replication::Asynchronous => "async",
    };
    let mut conn = sqlx::PgConnection::connect(&primary.url()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state: Option<(String, String)> = sqlx::query_as(
            "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = 'standby'",
        )
        .fetch_optional(&mut conn)
        .await
        .unwrap();
        if state
            .as_ref()
            .is_some_and(|(s, sync)| s == "streaming" && sync == want)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "standby not streaming ({want}): {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    conn.close().await.unwrap();
    pair
}
