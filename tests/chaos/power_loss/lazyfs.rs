//! LazyFS: found or built, mounted under the store, and made to lose what was not synced.

use super::*;

/// The LazyFS binary: `IDEMRELAY_LAZYFS`, or built by `tools/lazyfs/build.sh` (which skips the
/// build when its output directory already has it).
pub(super) fn lazyfs_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(LAZYFS_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{LAZYFS_ENV}={} is not a file", path.display()))
        };
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/lazyfs/build.sh");
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("lazyfs");
    let output = Command::new("bash")
        .arg(&script)
        .arg(&out_dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} {} failed ({}):\n{}",
            script.display(),
            out_dir.display(),
            output.status,
            tail(&String::from_utf8_lossy(&output.stderr), 20)
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("build.sh printed {path:?}, which is not a file"))
    }
}

pub(super) fn is_mounted(mnt: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let want = mnt.display().to_string();
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
}

/// A mounted LazyFS: `mnt` shows `root`, with LazyFS's cache in between. Unmounted on drop.
pub(super) struct LazyFs {
    pub(super) child: Child,
    pub(super) mnt: PathBuf,
    pub(super) fifo: PathBuf,
    pub(super) log: Arc<Mutex<String>>,
}

impl LazyFs {
    pub(super) fn mount(bin: &Path, dir: &Path) -> Result<LazyFs, String> {
        let (mnt, root) = (dir.join("mnt"), dir.join("root"));
        let fifo = dir.join("faults.fifo");
        let config = dir.join("lazyfs.toml");
        for d in [&mnt, &root] {
            std::fs::create_dir_all(d).map_err(|e| format!("mkdir {}: {e}", d.display()))?;
        }
        // As in tools/lazyfs/README.md: no eviction, so nothing reaches `root` unsynced.
        let toml = format!(
            "[faults]\nfifo_path=\"{}\"\n[cache]\napply_eviction=false\n[cache.simple]\n\
             custom_size=\"512mb\"\nblocks_per_page=1\n[filesystem]\nlog_all_operations=false\n\
             logfile=\"\"\n",
            fifo.display()
        );
        std::fs::write(&config, toml).map_err(|e| format!("write {}: {e}", config.display()))?;
        let mut child = Command::new(bin)
            .current_dir(dir)
            .arg(&mnt)
            .arg("--config-path")
            .arg(&config)
            .args(["-o", "allow_other", "-o", "modules=subdir", "-o"])
            .arg(format!("subdir={}", root.display()))
            .arg("-f")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let log = Arc::new(Mutex::new(String::new()));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        let mut fs = LazyFs {
            child,
            mnt,
            fifo,
            log,
        };
        let started = Instant::now();
        loop {
            if is_mounted(&fs.mnt) {
                return Ok(fs);
            }
            if let Some(status) = fs.child.try_wait().unwrap() {
                // Give the reader threads a moment to collect the last lines.
                std::thread::sleep(Duration::from_millis(200));
                return Err(format!(
                    "LazyFS exited before mounting ({status}):\n{}",
                    tail(&fs.log(), 20)
                ));
            }
            if started.elapsed() > MOUNT_LIMIT {
                return Err(format!(
                    "LazyFS did not mount within {MOUNT_LIMIT:?}:\n{}",
                    tail(&fs.log(), 20)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(super) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub(super) fn clears(&self) -> usize {
        self.log().matches("cache is cleared").count()
    }

    /// The power cut (the processes above are dead already): every unsynced byte is dropped.
    /// Returns once LazyFS says it is done.
    pub(super) async fn clear_cache(&self) {
        let before = self.clears();
        let fifo = self.fifo.clone();
        // Opening a FIFO for writing blocks until LazyFS has it open for reading.
        let write = tokio::task::spawn_blocking(move || {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&fifo)?
                .write_all(b"lazyfs::clear-cache\n")
        });
        match tokio::time::timeout(Duration::from_secs(20), write).await {
            Ok(Ok(Ok(()))) => {}
            other => panic!(
                "writing to the LazyFS fault FIFO failed: {other:?}\n{}",
                tail(&self.log(), 20)
            ),
        }
        let started = Instant::now();
        while self.clears() <= before {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "LazyFS did not report `cache is cleared`:\n{}",
                tail(&self.log(), 20)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        // Killed first: LazyFS aborts when it is unmounted under it (a core dump in its
        // working directory where cores are enabled); the dead mount is then removed.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let unmount = |flag: &str| {
            Command::new("fusermount3")
                .arg(flag)
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !unmount("-u") {
            unmount("-uz");
        }
    }
}
