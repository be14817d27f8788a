#!/usr/bin/env python3
"""The SQLite writes of N intakes as the relay's writer issues them (the message INSERT, whose
triggers add the job, turn and daily count: crates/store/src/sqlite/intake.rs), BATCH per commit (the
group commit at C=50 takes about ten), keys random as an app's would be; prints WAL frames
(page writes) and pages read per message. Checkpoints are off while it runs.
usage: sqlite_intake.py STORE.db N [BATCH] [cache_kib]"""
import os, secrets, sqlite3, sys, time
path, n = sys.argv[1], int(sys.argv[2])
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 10
cache_kib = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
db = sqlite3.connect(path, isolation_level=None)
for p in ("journal_mode = WAL", "synchronous = FULL", "foreign_keys = ON",
          f"cache_size = -{cache_kib}", "wal_autocheckpoint = 0"):
    db.execute("PRAGMA " + p)
db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
INSERT = """INSERT INTO messages (id, scope, idem_key, key_source, fingerprint, mail_from,
    rcpt_to, body_type, smtputf8, size, content, state, reply, accepted_at, dsn_of,
    spool_segment, spool_offset, content_hash, part, message_fp, upstream_key, header_message_id)
    VALUES (?, 'default', ?, 'header', ?, 'bench@example.com', 'rcpt@example.com', '7BIT', 0,
    1024, ?, 'queued', ?, ?, NULL, NULL, NULL, ?, 1, ?, ?, ?)
    ON CONFLICT (scope, idem_key, part) DO NOTHING"""
body = b"x" * 1024
def rchar():
    return int(dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())["rchar"])
def frames():
    return max(0, (os.path.getsize(path + "-wal") - 32) // (4096 + 24))
r0, f0 = rchar(), frames()
for i in range(n):
    if i % batch == 0:
        db.execute("BEGIN IMMEDIATE")
    now = int(time.time() * 1000)
    # Queue ids grow with time (a time prefix), keys and Message-IDs are random.
    qid = f"Q{now:013d}{i:06d}{secrets.token_hex(2)}"
    key = "order-" + secrets.token_hex(12)
    db.execute(INSERT, (qid, key, secrets.token_bytes(32), body, "250 2.0.0 OK queued as " + qid,
                        now, secrets.token_bytes(32), secrets.token_bytes(32), key,
                        secrets.token_hex(8) + "@app.example.com"))
    if i % batch == batch - 1 or i == n - 1:
        db.execute("COMMIT")
r1, f1 = rchar(), frames()
print(f"{path}: {n} inserts, {batch} per commit; per message: WAL frames {(f1 - f0) / n:.1f}, "
      f"pages read {(r1 - r0) / n / 4096:.1f}")
