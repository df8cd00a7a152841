// One rule for why a scope holds its runnable jobs back (issue 26, item 8):
// idemq._scope_waits() decides it for job() and stats(); the dashboard's
// /limits page words it per scope from the same limits() row
// (scopeWaitingFor in src/dashboard/limits-page.ts). Every combination of
// paused, held, no slot free and no start left, plus scopes without a
// concurrency or a rate limit, must get the same answer from both.
import { describe, expect, it } from "vitest";
import { SCOPE_WAITING_REASONS } from "../../src/contract.ts";
import { scopeWaitingFor } from "../../src/dashboard/limits-page.ts";
import { limits } from "../../src/sql/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { makeJob, unique } from "../helpers/jobs.ts";
import { claimJob } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 2 });

describe("scopeWaitingFor (dashboard) equals idemq._scope_waits()", () => {
  it("on every combination of paused, held, every slot held and the rate used up, and on scopes with neither limit", async () => {
    const expected = new Map<string, string | null>();
    for (let bits = 0; bits < 16; bits++) {
      const [paused, held, full, used] = [1, 2, 4, 8].map((b) => (bits & b) !== 0);
      const task = unique(`combo${bits}`);
      // One job running: it holds a slot of 1 (full) or of 2, and used a start of 1 (used) or of 2.
      await db.pool.query("SELECT idemq.set_limit(task => $1, concurrency => $2, rate => $3, per => '1 hour')", [task, full ? 1 : 2, used ? 1 : 2]);
      await claimJob(db.pool, await makeJob(db.pool, { task, queue: unique("q") }));
      if (paused) await db.pool.query("SELECT idemq.pause(task => $1)", [task]);
      // A hold to come, as hold() leaves it (hold.test.ts moves held_until the same way).
      if (held) await db.pool.query("UPDATE idemq.limits SET held_until = now() + interval '1 hour' WHERE kind = 'task' AND name = $1", [task]);
      expected.set(task, paused ? "paused" : held ? "held" : full ? "concurrency" : used ? "rate" : null);
    }
    const perKeyOnly = unique("per-key");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, per_key => 2)", [perKeyOnly]);
    expected.set(perKeyOnly, null);
    const pausedOnly = unique("paused-only");
    await db.pool.query("SELECT idemq.pause(queue => $1)", [pausedOnly]);
    expected.set(pausedOnly, "paused");
    const heldPassed = unique("held-passed");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 3)", [heldPassed]);
    await db.pool.query("UPDATE idemq.limits SET held_until = now() - interval '1 second' WHERE kind = 'queue' AND name = $1", [heldPassed]);
    expected.set(heldPassed, null);

    const rows = await limits(db.pool);
    const { rows: sql } = await db.pool.query<{ queue: string | null; task: string | null; waiting_for: string | null }>(
      "SELECT queue, task, waiting_for FROM idemq._scope_waits()",
    );
    const bySql = new Map(sql.map((r) => [r.queue ?? r.task, r.waiting_for]));
    const byDashboard = new Map(rows.map((r) => [r.queue ?? r.task, scopeWaitingFor(r)]));
    expect(byDashboard).toEqual(bySql);
    expect(bySql).toEqual(expected);
    expect(new Set(bySql.values())).toEqual(new Set([...SCOPE_WAITING_REASONS, null]));
  });
});
