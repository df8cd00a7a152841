// Backoff: the delay fail() puts between a failed attempt and the next one,
// for each kind (measured as run_at - now() in the failing transaction), and
// the validation of backoff specifications at enqueue.
import type pg from "pg";
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase, inRollback } from "../helpers/db.ts";
import { jobRow, makeJob } from "../helpers/jobs.ts";
import { claimOne, fail, makeDue } from "../helpers/work.ts";
import { underSavepoint } from "../helpers/savepoint.ts";

const db = useTestDatabase();

/** Seconds between each failure and the retry fail() schedules, for `failures` failures in a row. */
let series = 0;
async function retryDelays(c: pg.ClientBase, backoff: unknown, failures: number): Promise<number[]> {
  // A queue of its own: earlier series in the same transaction are still due.
  const queue = `series-${++series}`;
  const id = await makeJob(c, { backoff, max_attempts: failures + 1, queue });
  const delays: number[] = [];
  for (let i = 1; i <= failures; i++) {
    const job = await claimOne(c, { queues: [queue] });
    expect(job).toMatchObject({ job_id: id, attempt: i });
    expect(await fail(c, id, job.attempt)).toBe("scheduled");
    delays.push((await jobRow(c, id)).run_in);
    await makeDue(c, id);
  }
  return delays;
}

/** The polynomial formula's random part: (delay - (a-1)^4 - 15) / a, which must be a whole number in 0..29. */
function polynomialDraw(delay: number, attempt: number): number {
  return (delay - (attempt - 1) ** 4 - 15) / attempt;
}

describe("backoff delays", () => {
  it("fixed: each delay in turn, the last one repeating", async () => {
    await inRollback(db.pool, async (c) => {
      const delays = await retryDelays(c, { kind: "fixed", delays: ["2 seconds", "5 seconds", "10 seconds"] }, 4);
      expect(delays).toEqual([2, 5, 10, 10]);
    });
  });

  it("fixed: a single delay is used for every retry; shorthand intervals are accepted", async () => {
    await inRollback(db.pool, async (c) => {
      expect(await retryDelays(c, { kind: "fixed", delays: ["1 min"] }, 3)).toEqual([60, 60, 60]);
      expect(await retryDelays(c, { kind: "fixed", delays: ["0 seconds", "1h"] }, 2)).toEqual([0, 3600]);
    });
  });

  it("exponential: initial 2 s, factor 2 gives 2, 4, 8 s", async () => {
    await inRollback(db.pool, async (c) => {
      expect(await retryDelays(c, { kind: "exponential", initial: "2 seconds", factor: 2 }, 3)).toEqual([2, 4, 8]);
    });
  });

  it("exponential: factor defaults to 2; a fractional factor is allowed", async () => {
    await inRollback(db.pool, async (c) => {
      expect(await retryDelays(c, { kind: "exponential", initial: "3 seconds" }, 3)).toEqual([3, 6, 12]);
      expect(await retryDelays(c, { kind: "exponential", initial: "4 seconds", factor: 1.5 }, 3)).toEqual([4, 6, 9]);
    });
  });

  it("exponential: max caps the delay", async () => {
    await inRollback(db.pool, async (c) => {
      const delays = await retryDelays(c, { kind: "exponential", initial: "2 seconds", factor: 10, max: "30 seconds" }, 4);
      expect(delays).toEqual([2, 20, 30, 30]);
    });
  });

  it("exponential: jitter keeps each delay within ± jitter of the nominal one, and varies it", async () => {
    await inRollback(db.pool, async (c) => {
      const delays = await retryDelays(c, { kind: "exponential", initial: "10 seconds", factor: 1, jitter: 0.2 }, 30);
      for (const d of delays) {
        expect(d).toBeGreaterThanOrEqual(8);
        expect(d).toBeLessThanOrEqual(12);
      }
      expect(new Set(delays).size).toBeGreaterThan(1);
    });
  });

  it("exponential: jitter applies after the cap (within ± jitter of max)", async () => {
    await inRollback(db.pool, async (c) => {
      const delays = await retryDelays(c, { kind: "exponential", initial: "100 seconds", max: "10 seconds", jitter: 0.5 }, 10);
      for (const d of delays) {
        expect(d).toBeGreaterThanOrEqual(5);
        expect(d).toBeLessThanOrEqual(15);
      }
    });
  });

  it("polynomial (the default): (a-1)^4 + 15 + random(0..29)*a seconds", async () => {
    await inRollback(db.pool, async (c) => {
      const draws: number[] = [];
      for (const backoff of [null, { kind: "polynomial" }]) {
        for (let job = 0; job < 8; job++) {
          const delays = await retryDelays(c, backoff, 3);
          expect(delays[0]).toBeGreaterThanOrEqual(15);
          expect(delays[0]).toBeLessThanOrEqual(44);
          expect(delays[1]).toBeGreaterThanOrEqual(16);
          expect(delays[1]).toBeLessThanOrEqual(16 + 29 * 2);
          expect(delays[2]).toBeGreaterThanOrEqual(31);
          expect(delays[2]).toBeLessThanOrEqual(31 + 29 * 3);
          delays.forEach((d, i) => {
            const draw = polynomialDraw(d, i + 1);
            expect(Number.isInteger(draw), `attempt ${i + 1} delay ${d}`).toBe(true);
            expect(draw).toBeGreaterThanOrEqual(0);
            expect(draw).toBeLessThanOrEqual(29);
            draws.push(draw);
          });
        }
      }
      expect(new Set(draws).size).toBeGreaterThan(1);
    });
  });

  it("a very late attempt neither overflows nor goes negative: every kind stays within 10^9 seconds", async () => {
    await inRollback(db.pool, async (c) => {
      const specs = [
        null,
        { kind: "exponential", initial: "1 second" },
        { kind: "exponential", initial: "1 second", factor: 1e300, max: "100000000 years", jitter: 0.5 },
        { kind: "fixed", delays: ["100000000 years"] },
      ];
      for (const backoff of specs) {
        const id = await makeJob(c, { backoff, max_attempts: 2147483647 });
        expect((await claimOne(c)).job_id).toBe(id);
        // As if the job had already failed many times.
        await c.query("UPDATE idemq.jobs SET attempt = 100000 WHERE id = $1", [id]);
        expect(await fail(c, id, 100000)).toBe("scheduled");
        const { run_in } = await jobRow(c, id);
        expect(run_in, JSON.stringify(backoff)).toBeGreaterThan(0);
        expect(run_in, JSON.stringify(backoff)).toBeLessThanOrEqual(1e9);
      }
      const { rows } = await c.query<{ secs: number }>(
        "SELECT extract(epoch FROM idemq._backoff_delay(NULL, 2147483647))::float8 AS secs",
      );
      expect(rows[0]!.secs).toBe(1e9);
    });
  });
});

describe("backoff validation at enqueue", () => {
  const malformed: Array<[string, unknown, RegExp]> = [
    ["an unknown kind", { kind: "linear" }, /kind must be "polynomial", "exponential" or "fixed", not "linear"/],
    ["a missing kind", {}, /kind must be .* not missing/],
    ["not an object", "fast", /must be a JSON object/],
    ["exponential without initial", { kind: "exponential", factor: 2 }, /needs "initial"/],
    ["exponential with a zero initial", { kind: "exponential", initial: "0 seconds" }, /"initial" must be positive/],
    ["fixed with no delays", { kind: "fixed", delays: [] }, /needs "delays", a non-empty array/],
    ["fixed without delays", { kind: "fixed" }, /needs "delays"/],
    ["an interval in parsecs", { kind: "fixed", delays: ["5 parsecs"] }, /not an interval.*5 parsecs/],
    ["a negative delay", { kind: "fixed", delays: ["-1 seconds"] }, /must be non-negative intervals/],
    ["a delay that is a number", { kind: "fixed", delays: [5] }, /must be non-negative intervals/],
    ["a factor below 1", { kind: "exponential", initial: "2 seconds", factor: 0.5 }, /"factor" must be a number >= 1, not 0.5/],
    ["a factor given as a string", { kind: "exponential", initial: "2 seconds", factor: "2" }, /"factor" must be a number/],
    ["jitter of 1", { kind: "exponential", initial: "2 seconds", jitter: 1 }, /"jitter" must be a number in \[0, 1\), not 1/],
    ["negative jitter", { kind: "exponential", initial: "2 seconds", jitter: -0.1 }, /"jitter" must be a number in \[0, 1\)/],
    ["a zero max", { kind: "exponential", initial: "2 seconds", max: "0 seconds" }, /"max" must be a positive interval/],
    ["an unknown field", { kind: "fixed", delays: ["1 second"], max: "1 hour" }, /kind "fixed" has no field "max"/],
    ["a field of another kind", { kind: "polynomial", factor: 2 }, /kind "polynomial" has no field "factor"/],
  ];

  it.each(malformed)("rejects %s with 22023 and writes nothing", async (_name, backoff, message) => {
    await inRollback(db.pool, async (c) => {
      const count = async () =>
        (await c.query<{ n: number }>("SELECT (SELECT count(*) FROM idemq.jobs) + (SELECT count(*) FROM idemq.keys) AS n"))
          .rows[0]!.n;
      const before = await count();
      await underSavepoint(c, () =>
        expectSqlError(makeJob(c, { backoff, idempotency_key: "bad-backoff" }), { code: "22023", message }),
      );
      expect(await count()).toBe(before);
    });
  });

  it("enqueue_many names the element with the bad backoff and writes nothing", async () => {
    await inRollback(db.pool, async (c) => {
      const jobs = [
        { task: "ok", backoff: { kind: "fixed", delays: ["1 second"] } },
        { task: "bad", backoff: { kind: "exponential", initial: "2 seconds", jitter: 2 } },
      ];
      await underSavepoint(c, () =>
        expectSqlError(c.query("SELECT * FROM idemq.enqueue_many($1::jsonb)", [JSON.stringify(jobs)]), {
          code: "22023",
          message: /jobs\[2\].*jitter/,
        }),
      );
      expect((await c.query("SELECT count(*)::int AS n FROM idemq.jobs")).rows[0].n).toBe(0);
    });
  });

  it("accepts a JSON null backoff as the default (polynomial)", async () => {
    await inRollback(db.pool, async (c) => {
      const delays = await retryDelays(c, null, 1);
      expect(Number.isInteger(polynomialDraw(delays[0]!, 1))).toBe(true);
    });
  });
});
