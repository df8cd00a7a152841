#!/usr/bin/env bash
# Where a batched job's backend time and WAL go (read in bench/FINDINGS.md,
# "Where a batched job's backend time goes"). Not a test: one psql session
# claims 250 jobs of one task and completes them, 80 times (20,000 jobs), in
# the database you name, which it empties first (TRUNCATE idemq.jobs). Give
# it a migrated database of its own on a server of this machine, as a
# superuser (it reads the backend's CPU from /proc through pg_read_file and
# the WAL through pg_walinspect):
#
#   createdb -h 127.0.0.1 -U postgres batch_cost
#   node bin/idemq.js migrate --database-url postgres://postgres@127.0.0.1:5432/batch_cost
#   bench/batch-cost.sh postgres://postgres@127.0.0.1:5432/batch_cost [complete_many|complete_and_take_next]
#
# Prints the session's backend CPU and WAL per job, the functions' total and
# self time per job (track_functions), and the WAL per job by relation and
# record type, with how many heap updates of idemq.jobs left their page.
# Experiments (another fillfactor, a trigger disabled, a function replaced)
# are made in that database before a run; the numbers move with the
# machine's load, so alternate the variants and compare within one sitting.
set -euo pipefail
url=${1:?usage: bench/batch-cost.sh DATABASE_URL [complete_many|complete_and_take_next]}
completion=${2:-complete_many}
case "$completion" in
  complete_many) complete="SELECT count(*) FROM idemq.complete_many(:'ids', :'att', :'tok') \\g /dev/null" ;;
  complete_and_take_next) complete="SELECT count(*) FROM idemq.complete_and_take_next(:'ids', :'att', :'tok', 'w', NULL, '30 seconds', '{t}') \\g /dev/null" ;;
  *) echo "bench/batch-cost.sh: the completion is complete_many or complete_and_take_next, not $completion" >&2; exit 2 ;;
esac
psql() { command psql -X -q -v ON_ERROR_STOP=1 "$url" "$@"; }

psql -c "CREATE EXTENSION IF NOT EXISTS pg_walinspect" -c "TRUNCATE idemq.jobs CASCADE" -c "TRUNCATE idemq.job_counts" >/dev/null 2>&1
psql -c "SELECT count(*) FROM idemq.enqueue_many((SELECT jsonb_agg(jsonb_build_object('task', 't', 'payload', jsonb_build_object('n', g))) FROM generate_series(1, 20000) g))" >/dev/null
psql -c "VACUUM ANALYZE idemq.jobs" -c "CHECKPOINT" >/dev/null

cpu="(regexp_split_to_array(pg_read_file('/proc/' || pg_backend_pid() || '/stat'), ' '))"
{
  echo "SET track_functions = 'all';"
  echo "SELECT pg_stat_reset() \\g /dev/null"
  echo "SELECT ${cpu}[14]::bigint + ${cpu}[15]::bigint AS t0, pg_current_wal_lsn() AS l0 \\gset"
  for _ in $(seq 1 80); do
    echo "SELECT array_agg(job_id) AS ids, array_agg(attempt) AS att, array_agg(lease_token) AS tok FROM idemq.claim('w', batch_size => 250, lease => '30 seconds', tasks => '{t}', token => true) \\gset"
    echo "$complete"
  done
  # /proc counts clock ticks of 10 ms.
  echo "SELECT round((${cpu}[14]::bigint + ${cpu}[15]::bigint - :t0) * 10000.0 / 20000, 1) AS backend_cpu_us_per_job, round((pg_current_wal_lsn() - :'l0')::numeric / 20000) AS wal_bytes_per_job, pg_current_wal_lsn() AS l1 \\gset"
  echo "\\echo backend CPU :backend_cpu_us_per_job us/job, WAL :wal_bytes_per_job B/job"
  # The function statistics reach the view when the session reports them.
  echo "SELECT pg_sleep(0.7) \\g /dev/null"
  echo "SELECT funcname, calls, round(total_time::numeric * 1000 / 20000, 2) AS total_us_per_job, round(self_time::numeric * 1000 / 20000, 2) AS self_us_per_job FROM pg_stat_user_functions WHERE schemaname = 'idemq' ORDER BY total_time DESC LIMIT 12;"
  echo "SELECT coalesce(c.relname, '-') AS relation, w.record_type, round(count(*) / 20000.0, 3) AS records_per_job, round(sum(w.record_length) / 20000.0) AS bytes_per_job, round(sum(w.fpi_length) / 20000.0) AS fpi_bytes_per_job,
          count(*) FILTER (WHERE c.relname = 'jobs' AND w.record_type = 'UPDATE' AND w.block_ref ~ 'blkref #1') AS updates_off_page
   FROM pg_get_wal_records_info(:'l0', :'l1') w
   LEFT JOIN pg_class c ON c.relfilenode = substring(w.block_ref FROM 'rel \\d+/\\d+/(\\d+)')::oid
   GROUP BY 1, 2 HAVING sum(w.record_length) / 20000.0 >= 1 ORDER BY 4 DESC;"
} | psql
