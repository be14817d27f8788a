#!/bin/bash
# Samples what the backends of database DB wait on, every 10 ms for SECONDS seconds, and prints
# the share of samples per state/wait event (pg_stat_activity; "CPU" is an active backend
# waiting on nothing).   usage: tools/profile/pg_waits.sh postgresql://.../DB SECONDS
set -euo pipefail
URL=$1; SECS=$2
psql -Atq "$URL" <<SQL
CREATE TEMP TABLE samples (ev TEXT);
DO \$\$ BEGIN
  FOR i IN 1..($SECS * 100) LOOP
    INSERT INTO samples SELECT COALESCE(wait_event_type || ':' || wait_event, 'CPU')
        || ' ' || left(regexp_replace(query, '\s+', ' ', 'g'), 40)
      FROM pg_stat_activity
      WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active';
    PERFORM pg_sleep(0.01);
    PERFORM pg_stat_clear_snapshot();
  END LOOP;
END \$\$;
SELECT ev, COUNT(*), round(100.0 * COUNT(*) / SUM(COUNT(*)) OVER (), 1) || ' %'
  FROM samples GROUP BY ev ORDER BY 2 DESC;
SELECT 'samples per tick (active backends)', round(COUNT(*) / ($SECS * 100.0), 2) FROM samples;
SQL
