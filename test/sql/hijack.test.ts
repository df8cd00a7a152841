// No hijack (issue 11, item 3): objects planted in public and pg_temp never
// run inside idemq, whatever the caller's search_path. Planted here: now(),
// clock_timestamp(), md5(), random(), cardinality(), length(), unnest(),
// jsonb_typeof(), pg_notify(), gen_random_uuid(), the advisory-lock
// functions; the operators = on the idemq enums, on text, on bigint, on
// bigint[] and on uuid, <> on text, - on jsonb; and relations named like idemq's tables, as views in public and in
// each session's pg_temp. Every planted function, operator and view writes to
// a log table when it runs. Every public function is then called by a
// superuser and by a login of each idemq role, under `"$user", public` and
// under `public, pg_catalog`; every call must work and the log stay empty.
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { installationRoles } from "../../src/roles.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { createLoginRole, dropLoginRoles } from "../helpers/login-roles.ts";

const db = useTestDatabase({ poolSize: 4 });
type Who = "superuser" | "producer" | "worker" | "admin";
const sessions = {} as Record<Who, pg.Client>;
/** The planted objects' warnings each session received. */
const warnings = new Map<pg.Client, string[]>();

const PATHS = ['"$user", public', "public, pg_catalog"] as const;
const TABLES = ["jobs", "keys", "processed", "effects", "job_dependencies", "counters"];

/** A planted function: logs its name, then answers as the real one would, so a call that ran it still "works" and only the log tells. */
function plantFunction(signature: string, returns: string, body: string): string {
  const name = signature.slice(0, signature.indexOf("("));
  return `CREATE FUNCTION public.${signature} RETURNS ${returns} LANGUAGE plpgsql SET search_path = pg_catalog AS $f$
    BEGIN PERFORM public.hijack_ran('${name}'); ${body} END $f$;`;
}

function plantOperator(op: string, left: string, right: string, returns: string, fn: string): string {
  const label = `${op}(${left}, ${right})`;
  return `CREATE FUNCTION public.${fn}(a ${left}, b ${right}) RETURNS ${returns} LANGUAGE plpgsql SET search_path = pg_catalog AS $f$
      BEGIN PERFORM public.hijack_ran('${label.replace(/'/g, "''")}'); RETURN a OPERATOR(pg_catalog.${op}) b; END $f$;
    CREATE OPERATOR public.${op} (LEFTARG = ${left}, RIGHTARG = ${right}, FUNCTION = public.${fn});`;
}

const PLANTS = [
  `CREATE TABLE public.hijack_log (what text NOT NULL, by_role name NOT NULL DEFAULT current_user);
   GRANT SELECT, INSERT ON public.hijack_log TO PUBLIC;
   -- A WARNING too: it reaches the client even when the statement that ran the plant is rolled back.
   CREATE FUNCTION public.hijack_ran(what text) RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog
     AS $f$ BEGIN INSERT INTO public.hijack_log (what) VALUES (what); RAISE WARNING 'hijack: %', what; END $f$;
   CREATE FUNCTION public.hijack_seen(what text) RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog
     AS $f$ BEGIN PERFORM public.hijack_ran(what); RETURN false; END $f$;`,
  plantFunction("now()", "timestamptz", "RETURN pg_catalog.now();"),
  plantFunction("clock_timestamp()", "timestamptz", "RETURN pg_catalog.clock_timestamp();"),
  plantFunction("md5(t text)", "text", "RETURN pg_catalog.md5(t);"),
  plantFunction("random()", "float8", "RETURN pg_catalog.random();"),
  plantFunction("cardinality(a bigint[])", "int", "RETURN pg_catalog.cardinality(a);"),
  plantFunction("cardinality(a int[])", "int", "RETURN pg_catalog.cardinality(a);"),
  plantFunction("cardinality(a text[])", "int", "RETURN pg_catalog.cardinality(a);"),
  plantFunction("length(t text)", "int", "RETURN pg_catalog.length(t);"),
  plantFunction("jsonb_typeof(j jsonb)", "text", "RETURN pg_catalog.jsonb_typeof(j);"),
  plantFunction("unnest(a bigint[])", "SETOF bigint", "RETURN QUERY SELECT pg_catalog.unnest(a);"),
  plantFunction("pg_notify(c text, p text)", "void", "PERFORM pg_catalog.pg_notify(c, p);"),
  plantFunction("gen_random_uuid()", "uuid", "RETURN pg_catalog.gen_random_uuid();"),
  plantFunction("pg_try_advisory_lock(k bigint)", "boolean", "RETURN pg_catalog.pg_try_advisory_lock(k);"),
  plantFunction("pg_advisory_lock_shared(k bigint)", "void", "PERFORM pg_catalog.pg_advisory_lock_shared(k);"),
  plantFunction("pg_advisory_unlock(k bigint)", "boolean", "RETURN pg_catalog.pg_advisory_unlock(k);"),
  plantFunction("pg_advisory_unlock_shared(k bigint)", "boolean", "RETURN pg_catalog.pg_advisory_unlock_shared(k);"),
  plantFunction("pg_try_advisory_xact_lock_shared(k bigint)", "boolean", "RETURN pg_catalog.pg_try_advisory_xact_lock_shared(k);"),
  plantOperator("=", "idemq.job_state", "idemq.job_state", "boolean", "hj_eq_state"),
  plantOperator("=", "idemq.duplicate_policy", "idemq.duplicate_policy", "boolean", "hj_eq_policy"),
  plantOperator("=", "text", "text", "boolean", "hj_eq_text"),
  plantOperator("<>", "text", "text", "boolean", "hj_ne_text"),
  plantOperator("=", "bigint", "bigint", "boolean", "hj_eq_bigint"),
  plantOperator("=", "bigint[]", "bigint[]", "boolean", "hj_eq_bigints"),
  plantOperator("=", "uuid", "uuid", "boolean", "hj_eq_uuid"),
  plantOperator("-", "jsonb", "text[]", "jsonb", "hj_minus_jsonb"),
  ...TABLES.map((t) => `CREATE VIEW public.${t} AS SELECT 1 AS id WHERE public.hijack_seen('public.${t}');`),
];

beforeAll(async () => {
  // The idemq schema is in place before anything is planted, as in a real attack.
  for (const plant of PLANTS) await db.pool.query(plant);
  sessions.superuser = await db.newClient();
  for (const who of ["producer", "worker", "admin"] as const) {
    const login = await createLoginRole(`hj_${who}`, { memberOf: [(await installationRoles(db.pool))[who]] });
    sessions[who] = await login.connect(db.name);
  }
  for (const session of Object.values(sessions)) {
    warnings.set(session, []);
    session.on("notice", (notice) => {
      if (notice.message?.startsWith("hijack: ")) warnings.get(session)!.push(notice.message.slice("hijack: ".length));
    });
    for (const t of TABLES) await session.query(`CREATE TEMP VIEW ${t} AS SELECT 1 AS id WHERE public.hijack_seen('pg_temp.${t}')`);
  }
}, 60_000);

afterAll(async () => {
  // Temporary objects go with the session; drop them first so DROP ROLE finds nothing owned.
  for (const session of Object.values(sessions)) await session.query("DISCARD TEMP").catch(() => {});
  await dropLoginRoles();
});

type Call = (s: pg.Client) => Promise<pg.QueryResult>;
const at = () => new Date(Date.now() + 3_600_000).toISOString();

/** enqueue and enqueue_many, through every path: keys (new, deduplicated, conflicting), after, backoff. */
function producerCalls(queue: string): [string, Call][] {
  return [
    ["enqueue", (s) => s.query("SELECT * FROM idemq.enqueue(task => 'hj', queue => $1, payload => '{\"a\": 1}', idempotency_key => $2)", [queue, `${queue}-k`])],
    ["enqueue (deduplicated)", (s) => s.query("SELECT * FROM idemq.enqueue(task => 'hj', queue => $1, payload => '{\"a\": 1}', idempotency_key => $2)", [queue, `${queue}-k`])],
    [
      "enqueue (after, backoff, run_at)",
      async (s) => {
        const parent = await s.query<{ job_id: string }>("SELECT job_id FROM idemq.enqueue(task => 'hj', queue => $1)", [queue]);
        return s.query(
          `SELECT * FROM idemq.enqueue(task => 'hj', queue => $1, after => ARRAY[$2::bigint], backoff => '{"kind": "fixed", "delays": ["1 second"]}', run_at => $3::timestamptz)`,
          [queue, parent.rows[0]!.job_id, at()],
        );
      },
    ],
    [
      "enqueue_many",
      (s) =>
        s.query("SELECT * FROM idemq.enqueue_many(jobs => $1::jsonb)", [
          JSON.stringify([
            { task: "hj", queue, idempotency_key: `${queue}-m` },
            { task: "hj", queue, idempotency_key: `${queue}-m` },
            { task: "hj", queue, idempotency_key: `${queue}-m`, payload: { other: true } },
            { task: "hj", queue, idempotency_key: `${queue}-k`, duplicate_policy: "reject_always" },
            { task: "hj", queue, backoff: { kind: "exponential", initial: "1 second" } },
          ]),
        ]),
    ],
    ["active_states", (s) => s.query("SELECT idemq.active_states()")],
    ["terminal_states", (s) => s.query("SELECT idemq.terminal_states()")],
    [
      "job",
      async (s) => {
        const made = await s.query<{ job_id: string }>("SELECT job_id FROM idemq.enqueue(task => 'hj', queue => $1)", [queue]);
        const r = await s.query("SELECT * FROM idemq.job(job_id => $1)", [made.rows[0]!.job_id]);
        expect(r.rows).toHaveLength(1);
        return r;
      },
    ],
  ];
}

/** Every worker function, on 5 jobs of `queue` (keyed, one with a child waiting on it). */
function workerCalls(queue: string): [string, Call][] {
  let jobs: { id: string; attempt: number; token: string }[] = [];
  const job = (i: number) => [jobs[i]!.id, jobs[i]!.attempt, jobs[i]!.token];
  return [
    ["wait_for_jobs", (s) => s.query("SELECT idemq.wait_for_jobs(queues => ARRAY[$1::text])", [queue])],
    ["stop_waiting", (s) => s.query("SELECT idemq.stop_waiting(queues => ARRAY[$1::text])", [queue])],
    ["wait_for_jobs (all queues)", (s) => s.query("SELECT idemq.wait_for_jobs()")],
    ["stop_waiting (all queues)", (s) => s.query("SELECT idemq.stop_waiting()")],
    [
      "claim",
      async (s) => {
        const r = await s.query("SELECT * FROM idemq.claim(worker_id => 'hj', queues => ARRAY[$1::text], batch_size => 10, tasks => ARRAY['hj'])", [queue]);
        jobs = r.rows.map((row) => ({ id: row.job_id, attempt: row.attempt, token: row.lease_token })).sort((a, b) => Number(a.id) - Number(b.id));
        expect(jobs).toHaveLength(5);
        return r;
      },
    ],
    ["job", (s) => s.query("SELECT * FROM idemq.job(job_id => $1)", [jobs[0]!.id])],
    [
      "heartbeat",
      (s) =>
        s.query("SELECT * FROM idemq.heartbeat(job_ids => $1::bigint[], attempts => $2::int[], lease_tokens => $3::uuid[])", [
          jobs.map((j) => j.id),
          jobs.map((j) => j.attempt),
          jobs.map((j) => j.token),
        ]),
    ],
    ["complete", (s) => s.query("SELECT idemq.complete(job_id => $1, attempt => $2, result => '{\"ok\": true}', lease_token => $3)", job(0))],
    [
      "complete_many (a parent: its child is released)",
      (s) => s.query("SELECT * FROM idemq.complete_many(job_ids => ARRAY[$1::bigint], attempts => ARRAY[$2::int], lease_tokens => ARRAY[$3::uuid])", job(1)),
    ],
    ["fail (retried)", (s) => s.query(`SELECT * FROM idemq.fail(job_id => $1, attempt => $2, error => '{"class": "E", "message": "m"}', lease_token => $3)`, job(2))],
    [
      "fail (for good, task backoff)",
      (s) =>
        s.query(
          `SELECT * FROM idemq.fail(job_id => $1, attempt => $2, error => '"m"', retryable => false, backoff => '{"kind": "polynomial"}', max_attempts => 3, lease_token => $3)`,
          job(3),
        ),
    ],
    ["snooze", (s) => s.query("SELECT idemq.snooze(job_id => $1, attempt => $2, lease_token => $3, run_at => $4::timestamptz)", [...job(4), at()])],
    ["complete (lease lost: IQ410 as expected)", (s) => raisesUnderSavepoint(s, "IQ410", "SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => $3)", job(0))],
    ["fail (bad input: 22023 as expected)", (s) => raisesUnderSavepoint(s, "22023", "SELECT * FROM idemq.fail(job_id => $1, attempt => $2, error => '[]', lease_token => $3)", job(0))],
    ["guard", (s) => s.query("SELECT idemq.guard(key => $1, task => 'hj'), idemq.guard(key => $1, task => 'hj')", [`${queue}-g`])],
    ["effect_claim", (s) => s.query("SELECT * FROM idemq.effect_claim(key => $1, owner => 'o')", [`${queue}-e`])],
    ["effect_done", (s) => s.query("SELECT idemq.effect_done(key => $1, owner => 'o', result => '{}')", [`${queue}-e`])],
    ["effect_claim (done)", (s) => s.query("SELECT * FROM idemq.effect_claim(key => $1, owner => 'o')", [`${queue}-e`])],
    ["effect_claim (another)", (s) => s.query("SELECT * FROM idemq.effect_claim(key => $1, owner => 'o', stale_after => '1 minute')", [`${queue}-r`])],
    ["effect_release", (s) => s.query("SELECT idemq.effect_release(key => $1, owner => 'o')", [`${queue}-r`])],
    ["rescue", (s) => s.query("SELECT idemq.rescue()")],
    ["prune_keys", (s) => s.query("SELECT idemq.prune_keys(older_than => '0 seconds')")],
    ["apply_retention", (s) => s.query("SELECT idemq.apply_retention(batch_size => 10)")],
    ["worker_seen", (s) => s.query("SELECT idemq.worker_seen(worker_id => $1, queues => ARRAY[$1], tasks => '{hj,hj}')", [`${queue}-w`])],
    ["worker_seen (a refresh)", (s) => s.query("SELECT idemq.worker_seen(worker_id => $1)", [`${queue}-w`])],
    ["worker_stopped", (s) => s.query("SELECT idemq.worker_stopped(worker_id => $1)", [`${queue}-w`])],
    ["stats (the worker's metrics)", (s) => s.query("SELECT * FROM idemq.stats()")],
  ];
}

function adminCalls(queue: string): [string, Call][] {
  let ids: string[] = [];
  return [
    [
      "enqueue (for the admin calls)",
      async (s) => {
        const r = await s.query("SELECT * FROM idemq.enqueue_many(jobs => $1::jsonb)", [JSON.stringify([0, 1, 2].map((i) => ({ task: "hj-admin", queue, idempotency_key: `${queue}-a${i}` })))]);
        ids = r.rows.map((row) => row.job_id);
        return r;
      },
    ],
    ["reschedule", (s) => s.query("SELECT idemq.reschedule(job_id => $1, run_at => $2::timestamptz)", [ids[0], at()])],
    ["cancel", (s) => s.query("SELECT idemq.cancel(job_id => $1)", [ids[1]])],
    ["retry", (s) => s.query("SELECT idemq.retry(job_id => $1)", [ids[1]])],
    ["cancel (again)", (s) => s.query("SELECT idemq.cancel(job_id => $1)", [ids[1]])],
    ["purge", (s) => s.query("SELECT idemq.purge(older_than => '0 seconds')")],
    ["purge (states)", (s) => s.query("SELECT idemq.purge(older_than => '0 seconds', states => ARRAY['cancelled']::idemq.job_state[])")],
    ["purge (a batch)", (s) => s.query("SELECT idemq.purge(older_than => '0 seconds', batch_size => 10)")],
    ["set_retention (a queue override)", (s) => s.query("SELECT idemq.set_retention(state => 'succeeded', keep => '0 seconds', queue => $1)", [queue])],
    ["set_retention (a task override)", (s) => s.query("SELECT idemq.set_retention(state => 'failed', keep => '1 day', task => 'hj-admin')")],
    ["set_retention (a default)", (s) => s.query("SELECT idemq.set_retention(state => 'expired', keep => '30 days')")],
    ["set_retention (an override removed)", (s) => s.query("SELECT idemq.set_retention(state => 'failed', keep => NULL, task => 'hj-admin')")],
    ["stats", (s) => s.query("SELECT * FROM idemq.stats()")],
    ["overview", (s) => s.query("SELECT * FROM idemq.overview(exact_up_to => 0)")],
    ["workers", (s) => s.query("SELECT * FROM idemq.workers()")],
    ["unserved_jobs", (s) => s.query("SELECT * FROM idemq.unserved_jobs(seen_within => '1 minute')")],
    ["retry_horizon", (s) => s.query(`SELECT idemq.retry_horizon(backoff => '{"kind": "exponential", "initial": "1 second", "max": "1 hour"}', counted_attempts => 1, max_attempts => 5)`)],
  ];
}

/** complete and complete_many on their deleting path (retention 0 for the queue), keyed jobs: the ledger write too. */
function retentionZeroCalls(queue: string): [string, Call][] {
  let jobs: { id: string; attempt: number; token: string }[] = [];
  return [
    ["set_retention (succeeded 0 for a queue)", (s) => s.query("SELECT idemq.set_retention(state => 'succeeded', keep => '0 seconds', queue => $1)", [queue])],
    [
      "enqueue and claim (retention 0)",
      async (s) => {
        await s.query("SELECT * FROM idemq.enqueue_many(jobs => $1::jsonb)", [
          JSON.stringify([0, 1].map((i) => ({ task: "hj", queue, idempotency_key: `${queue}-z${i}` }))),
        ]);
        const r = await s.query("SELECT * FROM idemq.claim(worker_id => 'hj', queues => ARRAY[$1::text], batch_size => 2)", [queue]);
        jobs = r.rows.map((row) => ({ id: row.job_id, attempt: row.attempt, token: row.lease_token }));
        expect(jobs).toHaveLength(2);
        return r;
      },
    ],
    ["complete (retention 0: deleted)", (s) => s.query("SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => $3)", [jobs[0]!.id, jobs[0]!.attempt, jobs[0]!.token])],
    [
      "complete_many (retention 0: deleted)",
      (s) =>
        s.query("SELECT * FROM idemq.complete_many(job_ids => ARRAY[$1::bigint], attempts => ARRAY[$2::int], lease_tokens => ARRAY[$3::uuid])", [
          jobs[1]!.id,
          jobs[1]!.attempt,
          jobs[1]!.token,
        ]),
    ],
    [
      "complete (the job is gone: IQ404 as expected)",
      (s) => raisesUnderSavepoint(s, "IQ404", "SELECT idemq.complete(job_id => $1, attempt => $2, lease_token => $3)", [jobs[0]!.id, jobs[0]!.attempt, jobs[0]!.token]),
    ],
  ];
}

/** Runs a call that must raise `code`, under a savepoint so the transaction goes on. */
async function raisesUnderSavepoint(s: pg.Client, code: string, text: string, values: unknown[]): Promise<pg.QueryResult> {
  await s.query("SAVEPOINT expected_error");
  const error = await s.query(text, values).then(
    () => undefined,
    (e: { code?: string }) => e,
  );
  await s.query("ROLLBACK TO SAVEPOINT expected_error");
  expect(error?.code, text).toBe(code);
  return { rows: [] } as unknown as pg.QueryResult;
}

/** The jobs a worker's calls need, committed by the setup connection (whose search_path is the default; idemq's functions pin their own). */
async function workerFixtures(queue: string): Promise<void> {
  const rows = await db.pool.query<{ job_id: string }>("SELECT job_id FROM idemq.enqueue_many(jobs => $1::jsonb) ORDER BY ordinal", [
    JSON.stringify([0, 1, 2, 3, 4].map((i) => ({ task: "hj", queue, idempotency_key: `${queue}-w${i}` }))),
  ]);
  await db.pool.query("SELECT idemq.enqueue(task => 'hj-child', queue => $1, after => ARRAY[$2::bigint])", [`${queue}-children`, rows.rows[1]!.job_id]);
}

/** Everything: the worker calls on jobs this session enqueues itself (admin and superuser may). */
const allCalls = (q: string): [string, Call][] => [
  ...producerCalls(q),
  ["enqueue (the worker calls' jobs)", (s) => fixturesIn(s, `${q}-w`)],
  ...workerCalls(`${q}-w`),
  ...retentionZeroCalls(`${q}-zero`),
  ...adminCalls(`${q}-admin`),
];
const CALLS: Record<Who, (queue: string) => [string, Call][]> = {
  producer: producerCalls,
  worker: workerCalls,
  admin: allCalls,
  superuser: allCalls,
};

describe("the planted objects are live (a control: they do run where nothing pins the path)", () => {
  it.each(PATHS)("under %s, an unqualified call in the caller's own SQL runs the planted object", async (path) => {
    const s = sessions.worker;
    warnings.get(s)!.length = 0;
    await s.query("BEGIN");
    try {
      await s.query(`SET LOCAL search_path = ${path}`);
      // An exact argument-type match beats pg_catalog's polymorphic one whatever the order.
      await s.query("SELECT cardinality(ARRAY[1::bigint]), 'processing'::idemq.job_state = 'processing'::idemq.job_state, ARRAY[1::bigint] = ARRAY[1::bigint]");
      await s.query("SELECT count(*) FROM jobs");
      const { rows } = await s.query<{ what: string }>("SELECT what FROM public.hijack_log");
      const expected = ["=(bigint[], bigint[])", "=(idemq.job_state, idemq.job_state)", "cardinality", "pg_temp.jobs"];
      expect(rows.map((r) => r.what).sort()).toEqual(expected);
      expect([...warnings.get(s)!].sort()).toEqual(expected);
    } finally {
      await s.query("ROLLBACK");
    }
  });
});

describe.each(["superuser", "producer", "worker", "admin"] as const)("every public function called by %s", (who) => {
  it.each(PATHS)(`under search_path %s: every call works and no planted object runs`, async (path) => {
    const queue = unique(`hj-${who}`);
    if (who === "worker") await workerFixtures(queue);
    const s = sessions[who];
    const calls = CALLS[who](queue);
    warnings.get(s)!.length = 0;
    await s.query("BEGIN");
    try {
      await s.query(`SET LOCAL search_path = ${path}`);
      for (const [name, call] of calls) {
        await call(s).catch((error: Error) => {
          throw new Error(`${name} as ${who} under ${path}: ${error.message}`);
        });
      }
      const { rows } = await s.query<{ what: string; by_role: string }>("SELECT what, by_role FROM public.hijack_log");
      expect(rows, "planted objects that ran").toEqual([]);
      expect(warnings.get(s), "planted objects that ran (their warnings)").toEqual([]);
    } finally {
      await s.query("ROLLBACK");
    }
  });
});

/** The worker calls' jobs, made by a session that may enqueue (admin, superuser) in its own transaction. */
async function fixturesIn(s: pg.Client, queue: string): Promise<pg.QueryResult> {
  const rows = await s.query<{ job_id: string }>("SELECT job_id FROM idemq.enqueue_many(jobs => $1::jsonb)", [
    JSON.stringify([0, 1, 2, 3, 4].map((i) => ({ task: "hj", queue, idempotency_key: `${queue}-w${i}` }))),
  ]);
  const ids = rows.rows.map((r) => r.job_id).sort((a, b) => Number(a) - Number(b));
  return s.query("SELECT * FROM idemq.enqueue(task => 'hj-child', queue => $1, after => ARRAY[$2::bigint])", [`${queue}-children`, ids[1]]);
}
