// A task's own backoff is computed by the worker (src/worker/backoff.ts) and
// passed to fail() as retry_at. It must agree with idemq._backoff_delay, the
// schedule of jobs without a task backoff, and accept exactly what
// idemq._backoff_problem accepts. Compared here against the SQL itself.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { toBackoffJson, type Backoff } from "../src/contract.ts";
import { backoffDelayMs, toBackoffSchedule } from "../src/worker/backoff.ts";
import { freshDatabase, type TestDatabase } from "./helpers/db.ts";

let db: TestDatabase;

beforeAll(async () => {
  db = await freshDatabase({ poolSize: 2 });
});
afterAll(async () => {
  await db?.drop();
});

/** _backoff_delay in milliseconds (private: EXECUTE is revoked from PUBLIC; the test user may call it). */
async function sqlDelayMs(backoff: Backoff, attempt: number): Promise<number> {
  const { rows } = await db.pool.query<{ s: number }>(
    "SELECT extract(epoch FROM idemq._backoff_delay($1::jsonb, $2))::float8 AS s",
    [JSON.stringify(toBackoffJson(backoff)), attempt],
  );
  return rows[0]!.s * 1000;
}

const ATTEMPTS = Array.from({ length: 12 }, (_, i) => i + 1);

describe("without jitter the worker's delays equal _backoff_delay's", () => {
  const cases: [string, Backoff][] = [
    ["fixed, the last delay repeating", { kind: "fixed", delays: ["2s", "5s", "10s"] }],
    ["fixed, one short delay", { kind: "fixed", delays: ["100ms"] }],
    ["fixed, mixed units", { kind: "fixed", delays: ["1 minute 30 seconds", 250, "0s"] }],
    ["exponential, default factor, no max", { kind: "exponential", initial: "2s" }],
    ["exponential, factor 3, max 1 minute", { kind: "exponential", initial: "500ms", factor: 3, max: "1 minute" }],
    ["exponential, factor 1.5, max 10 s", { kind: "exponential", initial: 1000, factor: 1.5, max: "10s" }],
    ["exponential, factor 1", { kind: "exponential", initial: "7s", factor: 1 }],
  ];
  for (const [name, backoff] of cases) {
    it(name, async () => {
      const schedule = toBackoffSchedule(backoff, "test");
      for (const attempt of ATTEMPTS) {
        expect(backoffDelayMs(schedule, attempt), `attempt ${attempt}`).toBeCloseTo(await sqlDelayMs(backoff, attempt), 3);
      }
    });
  }

  it("exponential without max: both cap at 1e9 seconds", async () => {
    const backoff: Backoff = { kind: "exponential", initial: "1 hour", factor: 10 };
    const ms = backoffDelayMs(toBackoffSchedule(backoff, "test"), 20);
    expect(ms).toBe(1e12);
    expect(await sqlDelayMs(backoff, 20)).toBeCloseTo(ms, 0);
  });
});

describe("with randomness, the worker's range is _backoff_delay's", () => {
  it("polynomial: (a-1)^4 + 15 + k*a seconds, k in 0..29; every SQL draw is a value the worker can draw", async () => {
    const schedule = toBackoffSchedule({ kind: "polynomial" }, "test");
    for (const attempt of [1, 3, 6]) {
      const possible = new Set(Array.from({ length: 30 }, (_, k) => backoffDelayMs(schedule, attempt, () => k / 30)));
      expect(possible.size).toBe(30);
      expect(Math.min(...possible)).toBe(((attempt - 1) ** 4 + 15) * 1000);
      expect(Math.max(...possible)).toBe(((attempt - 1) ** 4 + 15 + 29 * attempt) * 1000);
      for (let draw = 0; draw < 30; draw++) {
        expect(possible.has(Math.round(await sqlDelayMs({ kind: "polynomial" }, attempt)))).toBe(true);
      }
    }
  });

  it("exponential with jitter 0.2: both stay within ±20% of the delay", async () => {
    const backoff: Backoff = { kind: "exponential", initial: "10s", factor: 2, jitter: 0.2 };
    const schedule = toBackoffSchedule(backoff, "test");
    const low = backoffDelayMs(schedule, 3, () => 0);
    const high = backoffDelayMs(schedule, 3, () => 1);
    expect([low, high]).toEqual([32_000, 48_000]);
    for (let draw = 0; draw < 30; draw++) {
      const sql = await sqlDelayMs(backoff, 3);
      expect(sql).toBeGreaterThanOrEqual(low);
      expect(sql).toBeLessThanOrEqual(high);
      const ts = backoffDelayMs(schedule, 3);
      expect(ts).toBeGreaterThanOrEqual(low);
      expect(ts).toBeLessThanOrEqual(high);
    }
  });
});

describe("the worker accepts what _backoff_problem accepts", () => {
  // Written with PostgreSQL interval text, so the same JSON goes to both sides.
  const cases: [string, Record<string, unknown>, boolean][] = [
    ["polynomial", { kind: "polynomial" }, true],
    ["exponential, all fields", { kind: "exponential", initial: "2 seconds", factor: 2, max: "1 hour", jitter: 0.1 }, true],
    ["fixed, zero delay", { kind: "fixed", delays: ["0 seconds", "5 seconds"] }, true],
    ["factor below 1", { kind: "exponential", initial: "2 seconds", factor: 0.5 }, false],
    ["jitter of 1", { kind: "exponential", initial: "2 seconds", jitter: 1 }, false],
    ["negative jitter", { kind: "exponential", initial: "2 seconds", jitter: -0.1 }, false],
    ["initial of 0", { kind: "exponential", initial: "0 seconds" }, false],
    ["max of 0", { kind: "exponential", initial: "2 seconds", max: "0 seconds" }, false],
    ["no initial", { kind: "exponential", factor: 2 }, false],
    ["no delays", { kind: "fixed", delays: [] }, false],
    ["a field of another kind", { kind: "fixed", delays: ["2 seconds"], factor: 2 }, false],
    ["an unknown kind", { kind: "linear" }, false],
  ];
  for (const [name, backoff, valid] of cases) {
    it(`${name}: ${valid ? "accepted" : "refused"} by both`, async () => {
      const { rows } = await db.pool.query<{ problem: string | null }>("SELECT idemq._backoff_problem($1::jsonb) AS problem", [
        JSON.stringify(backoff),
      ]);
      expect(rows[0]!.problem === null, `SQL: ${rows[0]!.problem}`).toBe(valid);
      const worker = () => toBackoffSchedule(backoff as Backoff, 'task "t"');
      if (valid) expect(worker).not.toThrow();
      else expect(worker).toThrow(/^task "t": /);
    });
  }
});
