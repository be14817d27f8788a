#!/bin/bash
# Instructions per delivered message of the relay draining a SQLite queue to the sink, under
# callgrind (docs/contributing/performance.md: the backlog profile). Counts do not depend on the load.
# usage: tools/profile/callgrind-drain.sh BIN STORE.db K TAG
#   STORE.db: a migrated store with K or more queued jobs (copied, so it can be reused), e.g.
#   one where K messages were submitted while delivery was paused, or the bench's
#   target/bench-tmp/backlog-1000000.db.
# Starts the sink and, under valgrind, a relay on the copy forwarding to it (the bench's
# delivery settings: 32 connections, no rate cap), zeroes the counters once it greets, resumes
# delivery, dumps when the sink holds K messages. Then:
#   callgrind_annotate --inclusive=yes /tmp/callgrind-TAG/cg.out.1
# NOVALGRIND=1: the relay runs as it is; prints the rate and its CPU per message (/proc).
# Under valgrind, work done per second (the heartbeat, the dead-lease check every 2 s) is
# stretched over the slowed deliveries: compare such costs in real time.
set -euo pipefail
BIN=$1; STORE=$2; K=$3; TAG=$4
D=/tmp/callgrind-$TAG; rm -rf "$D"; mkdir -p "$D"
cp "$STORE" "$D/relay.db"; sync "$D/relay.db"
sqlite3 "$D/relay.db" "UPDATE delivery_control SET paused_at = 1, reason = 'profile', probe = 0"
PORT=$((20000 + RANDOM % 20000)); SINK=$((PORT + 1)); API=$((PORT + 2))
IDEMRELAY_LOG=warn "$BIN" sink --listen 127.0.0.1:$SINK --api 127.0.0.1:$API >/dev/null 2>&1 &
SP=$!
printf '[delivery]\nconnections = 32\nrate = 1000000.0\nburst = 1000.0\nscan_interval = "50ms"\n' \
  >"$D/fast-upstream.toml"
VG=(valgrind --tool=callgrind --callgrind-out-file="$D/cg.out")
[ -n "${NOVALGRIND:-}" ] && VG=()
"${VG[@]}" "$BIN" serve \
  --listen 127.0.0.1:$PORT --hostname bench.test --admin 127.0.0.1:0 \
  --store "sqlite://$D/relay.db" --upstream "smtp://127.0.0.1:$SINK?tls=none" \
  --config "$D/fast-upstream.toml" 2>"$D/stderr" &
VP=$!
for _ in $(seq 300); do
  python3 -c "import socket;socket.create_connection(('127.0.0.1',$PORT)).close()" 2>/dev/null && break
  sleep 1
done
count() { curl -s "http://127.0.0.1:$API/counts" | python3 -c "import json,sys;print(json.load(sys.stdin)['messages'])"; }
cpu() { awk '{print $14, $15}' "/proc/$VP/stat"; }
[ -z "${NOVALGRIND:-}" ] && callgrind_control -z "$VP" >/dev/null
read -r U0 S0 < <(cpu); START=$(date +%s.%N)
sqlite3 -cmd ".timeout 10000" "$D/relay.db" "UPDATE delivery_control SET paused_at = NULL, reason = NULL"
until [ "$(count)" -ge "$K" ]; do sleep 0.5; done
END=$(date +%s.%N); read -r U1 S1 < <(cpu)
N=$(count)
if [ -n "${NOVALGRIND:-}" ]; then
  kill "$VP" "$SP"; wait "$VP" 2>/dev/null || true
  echo "$TAG: $N deliveries in $(echo "$END - $START" | bc) s = $(echo "$N / ($END - $START)" | bc) msg/s;" \
    "relay CPU $(( (U1 - U0 + S1 - S0) * 10000 / N )) us/msg (user $(( (U1 - U0) * 10000 / N )), system $(( (S1 - S0) * 10000 / N )))"
  exit 0
fi
callgrind_control -d "$VP" >/dev/null
sleep 1
kill "$VP" "$SP"; wait "$VP" 2>/dev/null || true
IR=$(grep "^summary:" "$D/cg.out.1" | awk '{print $2}')
echo "$TAG: total Ir $IR over $N deliveries = $((IR / N)) Ir/msg ($(echo "$END - $START" | bc) s under valgrind)"
