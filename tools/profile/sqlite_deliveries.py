#!/usr/bin/env python3
"""The SQLite writes of N deliveries, as the relay's writer issues them (claim, intent, final
outcome: crates/store/src/sqlite/queue.rs), one commit each, on a copy of a store; prints WAL frames
(page writes), bytes read by the process and pages read per delivered message.
usage: sqlite_deliveries.py STORE.db N [cache_kib]
Run under `valgrind --tool=callgrind` for instruction counts (load-independent); the store
must not be used by a relay at the time. Checkpoints are off while it runs, so the WAL's growth
counts every page written (a checkpoint later copies each distinct page once more)."""
import os, sqlite3, sys, time
path, n = sys.argv[1], int(sys.argv[2])
cache_kib = int(sys.argv[3]) if len(sys.argv) > 3 else 2000  # SQLite's default, the relay's
db = sqlite3.connect(path, isolation_level=None)
db.execute("PRAGMA journal_mode = WAL"); db.execute("PRAGMA synchronous = FULL")
db.execute("PRAGMA foreign_keys = ON"); db.execute(f"PRAGMA cache_size = -{cache_kib}")
db.execute("PRAGMA wal_autocheckpoint = 0")
db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
db.execute("UPDATE delivery_control SET paused_at = NULL WHERE id = 1")
LEASE = """UPDATE delivery_jobs
     SET lease_owner = ?2, lease_until = ?3, lease_token = lease_token + 1
     WHERE message_id = (
        SELECT message_id FROM (
            SELECT t.scope, t.turn,
                (SELECT j.message_id FROM delivery_jobs j
                 WHERE j.scope = t.scope AND j.due_at <= ?1
                   AND (j.lease_until IS NULL OR j.lease_until <= ?1)
                 ORDER BY j.due_at, j.rowid LIMIT 1) AS message_id
            FROM scope_turns t
            WHERE NOT EXISTS
                (SELECT 1 FROM delivery_control WHERE paused_at IS NOT NULL))
        WHERE message_id IS NOT NULL
        ORDER BY turn, scope
        LIMIT 1)
     RETURNING message_id, scope, lease_token"""
DETAILS = """SELECT m.idem_key, m.mail_from, m.rcpt_to, m.body_type,
        m.smtputf8, m.content, m.content_hash, m.spool_segment, m.spool_offset, m.size, m.accepted_at, j.first_attempt_at, j.lease_token,
        (SELECT COUNT(*) FROM attempts a WHERE a.message_id = m.id) AS attempts,
        EXISTS (SELECT 1 FROM attempts a
                WHERE a.message_id = m.id AND a.outcome = 'unknown') AS any_unknown,
        EXISTS (SELECT 1 FROM attempts a
                WHERE a.message_id = m.id AND a.outcome IS NULL) AS open_intent
     FROM messages m JOIN delivery_jobs j ON j.message_id = m.id WHERE m.id = ?"""
INTENT = """INSERT INTO attempts (message_id, attempt, owner, started_at)
     SELECT message_id, ?1, lease_owner, ?2 FROM delivery_jobs
     WHERE message_id = ?3 AND lease_token = ?4 AND lease_owner IS NOT NULL AND lease_until > ?2"""
def io():
    f = dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())
    return int(f["rchar"]), int(f["wchar"])
def wal_frames():
    try:
        return max(0, (os.path.getsize(path + "-wal") - 32) // (4096 + 24))
    except FileNotFoundError:
        return 0
now = lambda: int(time.time() * 1000)
r0, w0 = io(); f0 = wal_frames(); done = 0
for i in range(n):
    t = now()
    db.execute("BEGIN IMMEDIATE")
    row = db.execute(LEASE, (t, "perf", t + 60000)).fetchone()
    if row is None:
        db.execute("COMMIT"); break
    mid, scope, token = row
    db.execute(DETAILS, (mid,)).fetchone()
    db.execute("COMMIT")
    db.execute("BEGIN IMMEDIATE"); db.execute(INTENT, (1, now(), mid, token)); db.execute("COMMIT")
    t = now()
    db.execute("BEGIN IMMEDIATE")
    db.execute("DELETE FROM delivery_jobs WHERE message_id = ? AND lease_token = ? AND lease_owner IS NOT NULL", (mid, token))
    db.execute("""UPDATE attempts SET finished_at = ?, outcome = 'accepted', phase = 'dot', code = 250,
        reply = '250 2.0.0 Ok: queued as X', upstream_id = NULL WHERE message_id = ? AND attempt = 1""", (t, mid))
    db.execute("UPDATE messages SET state = 'delivered', upstream_reply = '250 2.0.0 Ok: queued as X', finished_at = ? WHERE id = ?", (t, mid))
    db.execute("COMMIT")
    done += 1
r1, w1 = io(); f1 = wal_frames(); done = max(done, 1)
print(f"{path}: {done} delivered; per message: WAL frames {(f1 - f0) / done:.1f}, "
      f"bytes read {(r1 - r0) / done:.0f} (= {(r1 - r0) / done / 4096:.1f} pages), "
      f"bytes written {(w1 - w0) / done:.0f}")
