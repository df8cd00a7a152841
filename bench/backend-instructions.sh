#!/usr/bin/env bash
# A batched worker's backend work counted in instructions, not seconds (read
# in bench/FINDINGS.md, "The keyed completion's cost"). Not a test. On a
# machine whose load comes and goes, time per job moves by ±20% between runs
# of one script; valgrind's callgrind counts the same instructions for the
# same work whatever else runs, so two variants of a function compare within
# a percent.
#
# It makes a private cluster in a temp dir (initdb, a free port), migrates a
# database there, enqueues N jobs of task t (keys: in keys of 20, K = 1, as
# the bench's process.keys; nokeys: without), then runs a single-user backend
# under callgrind that works them as the worker does: it holds up to 500
# claimed jobs (claim(batch_size => 500) when fewer than 50 are held) and
# completes 50 a call, keys with complete_and_take_next (the jobs it hands
# are held next), nokeys with complete_many. One transaction a call,
# asynchronous commit. perjob: one job at a time, a claim(batch_size => 1)
# and a complete() of it per call, the statements of an idle worker's or a
# transactional task's job (where a statement's fixed costs are not shared
# by 250 jobs: bench/FINDINGS.md, "A per-statement cost the batched loops
# hide"). Prints the backend's instructions per job; the callgrind file is
# kept for callgrind_annotate.
#
#   bench/backend-instructions.sh keys|nokeys|perjob [variant.sql]
#
# variant.sql is run in the database before the jobs are enqueued: a
# function's CREATE OR REPLACE to compare against the shipped one. Needs
# valgrind and PostgreSQL's server binaries (PG_BIN, else pg_config's
# bindir); run it from the repository after `npm run build`. About a minute.
set -euo pipefail
mode=${1:?usage: bench/backend-instructions.sh keys|nokeys|perjob [variant.sql]}
variant=${2:-}
case "$mode" in keys | nokeys | perjob) ;; *) echo "backend-instructions.sh: the mode is keys, nokeys or perjob, not $mode" >&2; exit 2 ;; esac
command -v valgrind >/dev/null || { echo "backend-instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
bin=${PG_BIN:-$(pg_config --bindir)}
n=${N:-20000}
dir=$(mktemp -d)
out=${OUT:-/tmp/backend-instructions.$mode.callgrind}
# initdb refuses to run as root: the cluster is the postgres user's then.
as() { if [ "$(id -u)" = 0 ]; then chown -R postgres "$dir"; su postgres -c "$*"; else sh -c "$*"; fi; }
port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
cleanup() { as "$bin/pg_ctl -D $dir/data -m immediate stop" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
as "$bin/initdb -D $dir/data -A trust -U postgres" >/dev/null
as "$bin/pg_ctl -D $dir/data -o '-p $port -k $dir -c listen_addresses=127.0.0.1' -l $dir/log -w start" >/dev/null
url=postgres://postgres@127.0.0.1:$port/postgres
node bin/idemq.js migrate --database-url "$url" >/dev/null
psql() { command psql -X -q -v ON_ERROR_STOP=1 "$url" "$@"; }
[ -n "$variant" ] && psql -f "$variant"
psql <<'SQL'
CREATE TABLE held (ids bigint[], att int[], tok uuid[]);
-- No compression: the held arrays' own cost stays small and equal for both modes.
ALTER TABLE held ALTER ids SET STORAGE EXTERNAL, ALTER att SET STORAGE EXTERNAL, ALTER tok SET STORAGE EXTERNAL;
INSERT INTO held VALUES ('{}', '{}', '{}');
CREATE FUNCTION step(keyed boolean) RETURNS void LANGUAGE plpgsql AS $$
DECLARE v_ids bigint[]; v_att int[]; v_tok uuid[]; n int;
BEGIN
  SELECT h.ids, h.att, h.tok INTO v_ids, v_att, v_tok FROM held h;
  IF cardinality(v_ids) < 50 THEN
    SELECT v_ids || coalesce(array_agg(c.job_id), '{}'), v_att || coalesce(array_agg(c.attempt), '{}'),
           v_tok || coalesce(array_agg(c.lease_token), '{}') INTO v_ids, v_att, v_tok
    FROM idemq.claim('w', batch_size => 500, lease => '30 seconds', tasks => '{t}', token => true) c;
  END IF;
  n := least(50, cardinality(v_ids));
  IF keyed THEN
    SELECT v_ids[n+1:] || coalesce(array_agg(c.job_id) FILTER (WHERE c.job_id IS NOT NULL), '{}'),
           v_att[n+1:] || coalesce(array_agg(c.attempt) FILTER (WHERE c.job_id IS NOT NULL), '{}'),
           v_tok[n+1:] || coalesce(array_agg(c.lease_token) FILTER (WHERE c.job_id IS NOT NULL), '{}')
      INTO v_ids, v_att, v_tok
    FROM idemq.complete_and_take_next(v_ids[1:n], v_att[1:n], v_tok[1:n], 'w', NULL, '30 seconds', '{t}') c;
  ELSE
    PERFORM idemq.complete_many(v_ids[1:n], v_att[1:n], v_tok[1:n]);
    v_ids := v_ids[n+1:]; v_att := v_att[n+1:]; v_tok := v_tok[n+1:];
  END IF;
  UPDATE held SET ids = v_ids, att = v_att, tok = v_tok;
END $$;
CREATE FUNCTION step_one() RETURNS void LANGUAGE plpgsql AS $$
DECLARE c record;
BEGIN
  SELECT * INTO c FROM idemq.claim('w', batch_size => 1, lease => '30 seconds', tasks => '{t}', token => true);
  PERFORM idemq.complete(c.job_id, c.attempt, lease_token => c.lease_token);
END $$;
SQL
key=""
[ "$mode" = keys ] && key="'concurrency_key', 'k' || (g - 1) / 20,"
psql -c "SELECT count(*) FROM idemq.enqueue_many((SELECT jsonb_agg(jsonb_build_object($key 'task', 't', 'payload', jsonb_build_object('n', g)) ORDER BY g) FROM generate_series(1, $n) g))" >/dev/null
psql -c "VACUUM ANALYZE idemq.jobs" -c "CHECKPOINT" >/dev/null
as "$bin/pg_ctl -D $dir/data -w stop" >/dev/null
keyed=$([ "$mode" = keys ] && echo true || echo false)
if [ "$mode" = perjob ]; then
  for _ in $(seq 1 "$n"); do echo "SELECT step_one();"; done > "$dir/loop.sql"
else
  for _ in $(seq 1 $((n / 50 + 20))); do echo "SELECT step($keyed);"; done > "$dir/loop.sql"
fi
as "valgrind --tool=callgrind --callgrind-out-file=$dir/out -q $bin/postgres --single -D $dir/data -c synchronous_commit=off postgres < $dir/loop.sql" > "$dir/single.log" 2>&1
cp "$dir/out" "$out"
as "$bin/pg_ctl -D $dir/data -o '-p $port -k $dir -c listen_addresses=127.0.0.1' -l $dir/log -w start" >/dev/null
left=$(psql -At -c "SELECT count(*) FROM idemq.jobs WHERE state <> 'succeeded'")
[ "$left" = 0 ] || { echo "backend-instructions.sh: $left jobs not succeeded; the loop failed:" >&2; grep -m3 ERROR "$dir/single.log" >&2; exit 1; }
total=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }')
echo "$mode${variant:+ with $variant}: $((total / n)) instructions per job ($n jobs; $out)"
