// A task's own backoff is checked by the worker when it is configured
// (src/worker/backoff.ts) and applied by fail() in SQL: idemq._backoff_delay
// is the one backoff model. Here: _backoff_delay's delays for the shapes tasks
// use, its random range (through `draw`), and that the worker accepts exactly
// what idemq._backoff_problem accepts.
import { describe, expect, it } from "vitest";
import { type Backoff } from "../../src/contract.ts";
import { toBackoffJson } from "../../src/encode.ts";
import { toMilliseconds } from "../../src/duration.ts";
import { checkBackoff } from "../../src/worker/backoff.ts";
import { useTestDatabase } from "../helpers/db.ts";

const db = useTestDatabase({ poolSize: 2 });


/** _backoff_delay in milliseconds (private: EXECUTE is revoked from PUBLIC; the test user may call it). */
async function sqlDelayMs(backoff: Backoff, attempt: number, draw?: number): Promise<number> {
  const { rows } = await db.pool.query<{ s: number }>(
    "SELECT extract(epoch FROM idemq._backoff_delay($1::jsonb, $2, draw => $3))::float8 AS s",
    [JSON.stringify(toBackoffJson(backoff)), attempt, draw ?? null],
  );
  return rows[0]!.s * 1000;
}

const ATTEMPTS = Array.from({ length: 12 }, (_, i) => i + 1);
const ms = (d: string | number) => toMilliseconds(d);

describe("without jitter _backoff_delay gives each kind's delays", () => {
  // The expected delay, as the design states it: fixed delays[a] (the last
  // repeating); exponential initial * factor^(a-1), capped at max.
  const cases: [string, Backoff, (a: number) => number][] = [
    ["fixed, the last delay repeating", { kind: "fixed", delays: ["2s", "5s", "10s"] }, (a) => [2000, 5000, 10_000][Math.min(a, 3) - 1]!],
    ["fixed, one short delay", { kind: "fixed", delays: ["100ms"] }, () => 100],
    ["fixed, mixed units", { kind: "fixed", delays: ["1 minute 30 seconds", 250, "0s"] }, (a) => [90_000, 250, 0][Math.min(a, 3) - 1]!],
    ["exponential, default factor, no max", { kind: "exponential", initial: "2s" }, (a) => 2000 * 2 ** (a - 1)],
    ["exponential, factor 3, max 1 minute", { kind: "exponential", initial: "500ms", factor: 3, max: "1 minute" }, (a) => Math.min(500 * 3 ** (a - 1), ms("1 minute"))],
    ["exponential, factor 1.5, max 10 s", { kind: "exponential", initial: 1000, factor: 1.5, max: "10s" }, (a) => Math.min(1000 * 1.5 ** (a - 1), 10_000)],
    ["exponential, factor 1", { kind: "exponential", initial: "7s", factor: 1 }, () => 7000],
  ];
  for (const [name, backoff, expected] of cases) {
    it(name, async () => {
      for (const attempt of ATTEMPTS) {
        expect(await sqlDelayMs(backoff, attempt), `attempt ${attempt}`).toBeCloseTo(expected(attempt), 3);
      }
    });
  }

  it("exponential without max: capped at 1e9 seconds", async () => {
    const backoff: Backoff = { kind: "exponential", initial: "1 hour", factor: 10 };
    expect(await sqlDelayMs(backoff, 20)).toBe(1e12);
  });
});

describe("with randomness, draw spans _backoff_delay's range", () => {
  it("polynomial: (a-1)^4 + 15 + k*a seconds, k in 0..29; every random delay is one of them; draw 1 gives the top", async () => {
    for (const attempt of [1, 3, 6]) {
      // draw (k + 0.5) / 30 picks k: floor(draw * 30) away from a rounding edge.
      const possible = new Set<number>();
      for (let k = 0; k < 30; k++) possible.add(Math.round(await sqlDelayMs({ kind: "polynomial" }, attempt, (k + 0.5) / 30)));
      expect(possible.size).toBe(30);
      expect(Math.min(...possible)).toBe(((attempt - 1) ** 4 + 15) * 1000);
      expect(Math.max(...possible)).toBe(((attempt - 1) ** 4 + 15 + 29 * attempt) * 1000);
      expect(await sqlDelayMs({ kind: "polynomial" }, attempt, 1)).toBe(Math.max(...possible));
      for (let draw = 0; draw < 30; draw++) {
        expect(possible.has(Math.round(await sqlDelayMs({ kind: "polynomial" }, attempt)))).toBe(true);
      }
    }
  });

  it("exponential with jitter 0.2: within ±20% of the delay, draw 0 and 1 at the ends", async () => {
    const backoff: Backoff = { kind: "exponential", initial: "10s", factor: 2, jitter: 0.2 };
    const low = await sqlDelayMs(backoff, 3, 0);
    const high = await sqlDelayMs(backoff, 3, 1);
    expect([low, high]).toEqual([32_000, 48_000]);
    for (let draw = 0; draw < 30; draw++) {
      const sql = await sqlDelayMs(backoff, 3);
      expect(sql).toBeGreaterThanOrEqual(low);
      expect(sql).toBeLessThanOrEqual(high);
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
      const worker = () => checkBackoff(backoff as Backoff, 'task "t"');
      if (valid) expect(worker).not.toThrow();
      else expect(worker).toThrow(/^task "t": /);
    });
  }
});
