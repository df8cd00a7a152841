// The named predicates the SQL functions share, each at its boundaries:
// _initial_state (scheduled if run_at > now, else enqueued), _held (the lease
// columns, inlined so fenced calls still probe the primary key),
// _unsuccessful_states (terminal but not succeeded), _queue_name_limit and
// _names_valid (a queue or task filter: NULL or non-empty names, inlined),
// _lease_until (a lease's end: the one formula every lease write uses).
import { readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { useTestDatabase, inRollback } from "../helpers/db.ts";
import { enqueue, stateOf } from "../helpers/jobs.ts";

const db = useTestDatabase({ poolSize: 2 });
/** The function files, read by the tests that hold their text to one definition. */
const FUNCTIONS = resolve(import.meta.dirname, "..", "..", "sql", "functions");

async function one<T>(sql: string, values: unknown[] = []): Promise<T> {
  return (await db.pool.query(sql, values)).rows[0].v as T;
}

describe("_initial_state", () => {
  it("run_at exactly now() is enqueued; a microsecond later is scheduled, a microsecond earlier enqueued; NULL is enqueued", async () => {
    // One statement: now() is the same instant in every column.
    const { rows } = await db.pool.query(
      `SELECT idemq._initial_state(now())::text AS at_now,
              idemq._initial_state(now() + interval '1 microsecond')::text AS just_after,
              idemq._initial_state(now() - interval '1 microsecond')::text AS just_before,
              idemq._initial_state(NULL)::text AS unset`,
    );
    expect(rows[0]).toEqual({ at_now: "enqueued", just_after: "scheduled", just_before: "enqueued", unset: "enqueued" });
  });

  it("is the state enqueue, enqueue_many and reschedule give a job due exactly now, or a microsecond later", async () => {
    await inRollback(db.pool, async (c) => {
      const now = (await c.query("SELECT now()::text AS now")).rows[0].now as string;
      const later = (await c.query("SELECT (now() + interval '1 microsecond')::text AS t")).rows[0].t as string;
      const single = [await enqueue(c, { task: "due_now", run_at: now }), await enqueue(c, { task: "later", run_at: later })];
      const many = await c.query<{ job_id: string }>(
        `SELECT m.job_id FROM idemq.enqueue_many(jsonb_build_array(
           jsonb_build_object('task', 'due_now', 'run_at', now()),
           jsonb_build_object('task', 'later', 'run_at', now() + interval '1 microsecond'))) m ORDER BY m.ordinal`,
      );
      const ids = [...single.map((e) => e.job_id), ...many.rows.map((r) => r.job_id)];
      const states: (string | undefined)[] = [];
      for (const id of ids) states.push(await stateOf(c, id)); // one client: one query at a time
      expect(states).toEqual(["enqueued", "scheduled", "enqueued", "scheduled"]);
      const rescheduled = await c.query(
        "SELECT idemq.reschedule($1, now())::text AS at_now, idemq.reschedule($2, now() + interval '1 microsecond')::text AS just_after",
        [ids[1], ids[0]],
      );
      expect(rescheduled.rows[0]).toEqual({ at_now: "enqueued", just_after: "scheduled" });
    });
  });
});

describe("_held", () => {
  it("is true only with both lease columns set", async () => {
    const { rows } = await db.pool.query(
      `SELECT idemq._held(now(), 'w') AS both, idemq._held(now(), NULL) AS no_worker,
              idemq._held(NULL, 'w') AS no_lease, idemq._held(NULL, NULL) AS neither`,
    );
    expect(rows[0]).toEqual({ both: true, no_worker: false, no_lease: false, neither: false });
  });

  it("is inlined: a fenced probe filters on the lease columns after the primary-key lookup, not through jobs_leases", async () => {
    await inRollback(db.pool, async (c) => {
      await c.query("SET LOCAL plan_cache_mode = force_generic_plan");
      await c.query(
        "PREPARE held_probe(bigint, int) AS SELECT 1 FROM idemq.jobs j WHERE j.id = $1 AND j.attempt = $2 AND idemq._held(j.lease_expires_at, j.locked_by)",
      );
      const plan = (await c.query("EXPLAIN (COSTS OFF) EXECUTE held_probe(1, 1)")).rows.map((r) => r["QUERY PLAN"]).join("\n");
      await c.query("DEALLOCATE held_probe");
      expect(plan).toContain("jobs_pkey");
      expect(plan).not.toContain("jobs_leases");
      expect(plan).toContain("(lease_expires_at IS NOT NULL) AND (locked_by IS NOT NULL)");
      expect(plan).not.toContain("_held");
    });
  });
});

describe("_lease_until", () => {
  it("is lease from now, never past locked_at + timeout; no timeout, no bound", async () => {
    const { rows } = await db.pool.query(
      `SELECT idemq._lease_until(now(), '5 seconds', '30 seconds') - now() AS timeout_first,
              idemq._lease_until(now(), '10 minutes', '30 seconds') - now() AS lease_first,
              idemq._lease_until(now(), '30 seconds', '30 seconds') - now() AS equal,
              idemq._lease_until(now(), NULL, '30 seconds') - now() AS no_timeout,
              idemq._lease_until(now() - interval '50 seconds', '1 minute', '30 seconds') - now() AS renewed_near_the_limit,
              idemq._lease_until(now() - interval '2 minutes', '1 minute', '30 seconds') - now() AS past_the_limit`,
    );
    const text = Object.fromEntries(Object.entries(rows[0]).map(([k, v]) => [k, (v as { toPostgres(): string }).toPostgres()]));
    expect(text).toEqual({
      timeout_first: "5 seconds",
      lease_first: "30 seconds",
      equal: "30 seconds",
      no_timeout: "30 seconds",
      renewed_near_the_limit: "10 seconds",
      past_the_limit: "-1 minutes",
    });
  });

  it("is inlined into the statement that writes the lease", async () => {
    const plan = (
      await db.pool.query("EXPLAIN (VERBOSE, COSTS OFF) SELECT idemq._lease_until(j.locked_at, j.timeout, interval '30 seconds') FROM idemq.jobs j")
    ).rows
      .map((r) => r["QUERY PLAN"])
      .join("\n");
    expect(plan).toMatch(/LEAST\(/);
    expect(plan).not.toContain("_lease_until");
  });

  it("is the only way a function of sql/functions sets a lease: every other write of lease_expires_at clears it", () => {
    const writes: string[] = [];
    for (const family of readdirSync(FUNCTIONS, { withFileTypes: true }).filter((e) => e.isDirectory())) {
      for (const file of readdirSync(join(FUNCTIONS, family.name)).filter((f) => f.endsWith(".sql"))) {
        const code = readFileSync(join(FUNCTIONS, family.name, file), "utf8")
          .split("\n")
          .filter((line) => !line.trimStart().startsWith("--"))
          .join("\n");
        for (const m of code.matchAll(/lease_expires_at\s*=\s*([^,\n]+)/g)) {
          const value = m[1]!.trim();
          if (!/^NULL\b/.test(value)) writes.push(`${family.name}/${file}: ${value}`);
        }
      }
    }
    expect(writes.filter((w) => !w.includes("idemq._lease_until("))).toEqual([]);
    expect(writes.map((w) => w.split(":")[0]).sort()).toEqual([
      "attempts/claim.sql",
      "attempts/claim.sql",
      "attempts/heartbeat.sql",
      "flow/_key_promote.sql",
    ]);
  });
});

describe("what starting an attempt writes", () => {
  it("is the same columns in claim's two UPDATEs and the hand-off's (_key_promote), with the same values but the slots and the worker", () => {
    const starts = ["attempts/claim.sql", "flow/_key_promote.sql"].flatMap((file) =>
      [...readFileSync(join(FUNCTIONS, file), "utf8").matchAll(/SET state = 'processing',([\s\S]*?)\n\s*(?:FROM|WHERE) /g)].map((m) => ({
        file,
        columns: new Map(
          m[1]!
            .split("\n")
            .filter((line) => !line.trimStart().startsWith("--"))
            .join(" ")
            .split(/,\s*(?![^()]*\))/)
            .map((assignment) => assignment.trim().split(/\s*=\s*/) as [string, string])
            .map(([column, value]) => [column, value.replace(/\b(worker_id|v_worker|v_lease|lease)\b/g, "<arg>").replace(/\s+/g, " ")]),
        ),
      })),
    );
    expect(starts.map((s) => s.file)).toEqual(["attempts/claim.sql", "attempts/claim.sql", "flow/_key_promote.sql"]);
    const [claimPlain, claimSlots, handOff] = starts.map((s) => s.columns);
    const names = [...claimPlain!.keys()].sort();
    expect(names).toEqual(["attempt", "lease_expires_at", "lease_lost", "lease_token", "locked_at", "locked_by", "progress", "queue_slot", "task_slot"]);
    expect([...claimSlots!.keys()].sort()).toEqual(names);
    expect([...handOff!.keys()].sort()).toEqual(names);
    for (const column of ["attempt", "lease_expires_at", "lease_lost", "locked_at", "locked_by", "progress"]) {
      expect(claimSlots!.get(column), column).toBe(claimPlain!.get(column));
      expect(handOff!.get(column), column).toBe(claimPlain!.get(column));
    }
    // A hand-off is claim(..., token => true); it takes no slot (a job under a concurrency limit is never handed).
    expect(handOff!.get("lease_token")).toBe("gen_random_uuid()");
    expect(claimPlain!.get("lease_token")).toBe("CASE WHEN claim.token THEN gen_random_uuid() END");
    expect([handOff!.get("queue_slot"), handOff!.get("task_slot")]).toEqual(["NULL", "NULL"]);
  });
});

describe("_unsuccessful_states", () => {
  it("is terminal_states() without succeeded: failed, cancelled, expired", async () => {
    const { rows } = await db.pool.query(
      `SELECT ARRAY(SELECT s::text FROM unnest(idemq._unsuccessful_states()) s ORDER BY s) AS helper,
              ARRAY(SELECT s::text FROM unnest(idemq.terminal_states()) s WHERE s <> 'succeeded' ORDER BY s) AS terminal`,
    );
    expect(rows[0].helper).toEqual(rows[0].terminal);
    expect([...rows[0].helper].sort()).toEqual(["cancelled", "expired", "failed"]);
  });
});

describe("_queue_name_limit", () => {
  it("is 1000 characters, the limit enqueue and enqueue_many enforce (test/sql/enqueue.test.ts checks 1000 and 1001)", async () => {
    expect(await one<number>("SELECT idemq._queue_name_limit() AS v")).toBe(1000);
  });
});

describe("_names_valid", () => {
  it("is true for NULL and for lists of non-empty names; false for an empty list, a NULL name or an empty name, wherever it stands", async () => {
    const cases: Array<[string | null, boolean]> = [
      [null, true],
      ["{a}", true],
      ["{a,b}", true],
      ['{" "}', true],
      ["{}", false],
      ["{NULL}", false],
      ["{a,NULL}", false],
      ['{""}', false],
      ['{a,""}', false],
      ['{"",NULL}', false],
    ];
    for (const [names, valid] of cases) {
      expect(await one<boolean>("SELECT idemq._names_valid($1::text[]) AS v", [names]), String(names)).toBe(valid);
    }
  });

  it("is inlined: the plan of a check evaluates the expression, not a call of _names_valid", async () => {
    await inRollback(db.pool, async (c) => {
      await c.query("SET LOCAL plan_cache_mode = force_generic_plan");
      await c.query("PREPARE names_check(text[]) AS SELECT NOT idemq._names_valid($1)");
      const plan = (await c.query("EXPLAIN (VERBOSE, COSTS OFF) EXECUTE names_check('{a}')")).rows.map((r) => r["QUERY PLAN"]).join("\n");
      await c.query("DEALLOCATE names_check");
      expect(plan).toContain("ANY");
      expect(plan).not.toContain("_names_valid");
    });
  });
});
