// idemq.retry_horizon(backoff, counted_attempts, max_attempts): the sum of the
// longest backoff delays the remaining retries of a job can take, which
// `idemq doctor` compares with the key retention. Checked against
// idemq._backoff_delay itself, at its boundaries, and for its cap.
import { describe, expect, it } from "vitest";
import { HORIZON_CAP_SECONDS } from "../../src/cli/commands/doctor.ts";
import { expectSqlError, useTestDatabase } from "../helpers/db.ts";

const db = useTestDatabase({ poolSize: 2 });

/** retry_horizon in seconds. */
async function horizon(backoff: unknown, counted: number, maxAttempts: number): Promise<number> {
  const { rows } = await db.pool.query<{ s: number }>(
    "SELECT extract(epoch FROM idemq.retry_horizon($1::jsonb, $2, $3))::float8 AS s",
    [backoff === null ? null : JSON.stringify(backoff), counted, maxAttempts],
  );
  return rows[0]!.s;
}

/** _backoff_delay in seconds for failures from..to. */
async function delays(backoff: unknown, from: number, to: number): Promise<number[]> {
  const { rows } = await db.pool.query<{ s: number }>(
    "SELECT extract(epoch FROM idemq._backoff_delay($1::jsonb, a))::float8 AS s FROM generate_series($2::int, $3::int) a ORDER BY a",
    [backoff === null ? null : JSON.stringify(backoff), from, to],
  );
  return rows.map((r) => r.s);
}
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);

describe("retry horizon", () => {
  it("equals the sum of idemq._backoff_delay for fixed and exponential backoffs, and bounds polynomial samples", async () => {
    // fixed, 6 attempts, 2 counted: delays after failures 2..5 (the last delay repeats).
    const fixed = { kind: "fixed", delays: ["1 hour", "1 day", "2 days"] };
    expect(await horizon(fixed, 2, 6)).toBe(sum(await delays(fixed, 2, 5)));

    // exponential without jitter, capped: 1h, 3h, 9h, then 1 day.
    const exponential = { kind: "exponential", initial: "1 hour", factor: 3, max: "1 day" };
    expect(await horizon(exponential, 0, 8)).toBe(sum(await delays(exponential, 1, 7)));
    expect(await horizon(exponential, 0, 8)).toBe(3600 + 10800 + 32400 + 4 * 86400);
    // With jitter, the top of the range.
    expect(await horizon({ ...exponential, jitter: 0.1 }, 0, 8)).toBeCloseTo(1.1 * (3600 + 10800 + 32400 + 4 * 86400), 6);

    // polynomial: random within 29*a below the worst case the horizon assumes.
    for (let a = 1; a <= 5; a++) {
      const worst = await horizon(null, a, a + 1);
      expect(worst).toBe((a - 1) ** 4 + 15 + 29 * a);
      const { rows } = await db.pool.query<{ lo: number; hi: number }>(
        "SELECT min(s) AS lo, max(s) AS hi FROM (SELECT extract(epoch FROM idemq._backoff_delay(NULL, $1::int))::float8 AS s FROM generate_series(1, 300)) x",
        [a],
      );
      expect(rows[0]!.hi).toBeLessThanOrEqual(worst);
      expect(rows[0]!.lo).toBeGreaterThanOrEqual(worst - 29 * a);
    }

    // A huge max_attempts stays fast and capped at 100 years (36500 days).
    const started = performance.now();
    expect(await horizon(null, 0, 2_147_483_647)).toBe(100 * 365 * 86400);
    expect(await horizon({ kind: "fixed", delays: ["1 second"] }, 0, 2_147_483_647)).toBe(2_147_483_646);
    expect(performance.now() - started).toBeLessThan(1000);
  });

  it("its cap is the one doctor reports as over 100 years", async () => {
    expect(await horizon(null, 0, 2_147_483_647)).toBe(HORIZON_CAP_SECONDS);
  });

  it("counts a delay after every failure but the last: none left is 0; counted 0 is counted 1", async () => {
    const fixed = { kind: "fixed", delays: ["10 seconds"] };
    expect(await horizon(fixed, 2, 3)).toBe(10); // failure 2 is followed by attempt 3
    expect(await horizon(fixed, 3, 3)).toBe(0); // the last attempt failed: no retry
    expect(await horizon(fixed, 5, 3)).toBe(0);
    expect(await horizon(fixed, 0, 1)).toBe(0); // one attempt: never retried
    expect(await horizon(fixed, 0, 4)).toBe(await horizon(fixed, 1, 4));
    expect(await horizon(fixed, 0, 4)).toBe(30);
  });

  it("raises 22004 for NULL attempts and 22023 for a malformed backoff", async () => {
    await expectSqlError(db.pool.query("SELECT idemq.retry_horizon(NULL, NULL, 3)"), { code: "22004" });
    await expectSqlError(db.pool.query("SELECT idemq.retry_horizon(NULL, 1, NULL)"), { code: "22004" });
    await expectSqlError(db.pool.query(`SELECT idemq.retry_horizon('{"kind": "linear"}', 1, 3)`), {
      code: "22023",
      message: /^retry_horizon: backoff kind must be/,
    });
  });

  it("raises 22023 with a HINT, before any arithmetic, for attempts no job has (counted_attempts < 0, max_attempts < 1), at the int extremes too", async () => {
    const hint = "Pass the job's attempt - uncounted (0 before its first attempt) and its max_attempts.";
    for (const [counted, max] of [[-2147483648, 1000], [-1, 3], [0, 0], [1, -2147483648]] as const) {
      await expectSqlError(db.pool.query("SELECT idemq.retry_horizon(NULL, $1, $2)", [counted, max]), {
        code: "22023",
        message: `retry_horizon: counted_attempts must be at least 0 and max_attempts at least 1, not ${counted} and ${max}`,
        hint,
      });
    }
    expect(await horizon(null, 0, 1), "the smallest accepted values").toBe(0);
    expect(await horizon({ kind: "fixed", delays: ["1 second"] }, 2147483647, 2147483647), "the largest").toBe(0);
  });
});
