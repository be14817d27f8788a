#!/bin/bash
# Instructions per message of the relay or the sink under callgrind: counts that do not depend
# on the machine's load (docs/contributing/performance.md, "What the relay spends per message").
# usage: tools/profile/callgrind-per-message.sh BIN relay|sink N C TAG
#   e.g. tools/profile/callgrind-per-message.sh target/release/idemrelay relay 1000 50 c50
# Starts BIN under valgrind (relay: default settings, a fresh SQLite store in /tmp/callgrind-TAG),
# sends 100 warm-up messages, zeroes the counters, sends N messages at concurrency C (1 KB, a new
# connection each, tools/profile/smtp_load.py), dumps, prints instructions per message for the
# whole process. Then: callgrind_annotate --inclusive=yes /tmp/callgrind-TAG/cg.out.1
# STORE=postgresql://... runs the relay on that store instead; COPY=some.db starts it on a copy
# of that SQLite store (a backlog, say) instead of a new one.
set -euo pipefail
BIN=$1; KIND=$2; N=$3; C=$4; TAG=$5
LOAD="$(dirname "$0")/smtp_load.py"
D=/tmp/callgrind-$TAG; rm -rf "$D"; mkdir -p "$D"
PORT=$((20000 + RANDOM % 20000)); API=$((PORT+1))
if [ -n "${COPY:-}" ]; then cp "$COPY" "$D/relay.db"; sync "$D/relay.db"; fi
if [ "$KIND" = relay ]; then
  ARGS="serve --listen 127.0.0.1:$PORT --hostname bench.test --admin 127.0.0.1:0 --store ${STORE:-sqlite://$D/relay.db}"
else
  ARGS="sink --listen 127.0.0.1:$PORT --api 127.0.0.1:$API"
  export IDEMRELAY_LOG=warn
fi
# shellcheck disable=SC2086
valgrind --tool=callgrind --callgrind-out-file="$D/cg.out" "$BIN" $ARGS 2>"$D/stderr" &
VP=$!
for _ in $(seq 60); do
  python3 -c "import socket;socket.create_connection(('127.0.0.1',$PORT)).close()" 2>/dev/null && break
  sleep 1
done
python3 "$LOAD" 127.0.0.1 "$PORT" 100 "$C" "warm-$TAG"
callgrind_control -z "$VP" >/dev/null
python3 "$LOAD" 127.0.0.1 "$PORT" "$N" "$C" "run-$TAG"
callgrind_control -d "$VP" >/dev/null
sleep 1
kill "$VP"; wait "$VP" 2>/dev/null || true
IR=$(grep "^summary:" "$D/cg.out.1" | awk '{print $2}')
echo "$TAG: total Ir $IR over $N msgs = $((IR / N)) Ir/msg"
