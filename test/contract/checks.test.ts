// The CHECKs of idemq.jobs and idemq.keys that migration 0022 respelt so that
// PostgreSQL prepares them cheaply (it parses and plans them at every
// statement): each installed spelling accepts exactly the rows its earlier
// spelling accepted, over a grid that crosses every boundary of the rule; and
// the traceparent CHECK's regular expression is the one _is_traceparent, the
// rule's one definition, holds.
import { describe, expect, it } from "vitest";
import { LIMIT_BOUNDS } from "../../src/contract.ts";
import { useTestDatabase } from "../helpers/db.ts";

const db = useTestDatabase();

/** The installed expression of a CHECK, as the catalog prints it, without CHECK ( ... ) and NOT VALID. */
async function installed(name: string): Promise<string> {
  const { rows } = await db.pool.query<{ def: string }>(
    "SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE connamespace = 'idemq'::regnamespace AND conname = $1",
    [name],
  );
  expect(rows, name).toHaveLength(1);
  const m = /^CHECK \((.*)\)( NOT VALID)?$/s.exec(rows[0]!.def);
  expect(m, rows[0]!.def).not.toBeNull();
  return m![1]!;
}

/**
 * Rows of `grid` (a SELECT naming the CHECK's columns) where the installed
 * CHECK and `earlier` disagree: a CHECK passes unless its expression is false.
 */
async function disagreements(name: string, earlier: string, grid: string): Promise<{ rows: unknown[]; total: number }> {
  const now = await installed(name);
  const { rows } = await db.pool.query<{ row: unknown; agree: boolean }>(
    `SELECT to_jsonb(g) AS row, coalesce((${now}), true) = coalesce((${earlier}), true) AS agree FROM (${grid}) g`,
  );
  return { rows: rows.filter((r) => !r.agree).map((r) => r.row), total: rows.length };
}

describe("respelt CHECKs accept the rows their earlier spellings accepted", () => {
  it("jobs_attempt_in_range: every attempt, uncounted and max_attempts from -2 to 4", async () => {
    const { rows, total } = await disagreements(
      "jobs_attempt_in_range",
      "attempt >= 0 AND uncounted >= 0 AND attempt - uncounted BETWEEN 0 AND max_attempts",
      `SELECT a AS attempt, u AS uncounted, m AS max_attempts
         FROM generate_series(-2, 4) a, generate_series(-2, 4) u, generate_series(-2, 4) m`,
    );
    expect(total).toBe(343);
    expect(rows).toEqual([]);
  });

  it("jobs_finished_iff_terminal: every state, with and without finished_at", async () => {
    const { rows, total } = await disagreements(
      "jobs_finished_iff_terminal",
      "(state IN ('succeeded', 'failed', 'expired', 'cancelled')) = (finished_at IS NOT NULL)",
      `SELECT s AS state, f AS finished_at
         FROM unnest(enum_range(NULL::idemq.job_state)) s, unnest(ARRAY[NULL, now()]::timestamptz[]) f`,
    );
    expect(total).toBe(16);
    expect(rows).toEqual([]);
  });

  it("keys_finished_state_terminal: every state and NULL", async () => {
    const { rows, total } = await disagreements(
      "keys_finished_state_terminal",
      "finished_state IS NULL OR finished_state IN ('succeeded', 'failed', 'expired', 'cancelled')",
      "SELECT s AS finished_state FROM unnest(enum_range(NULL::idemq.job_state) || NULL::idemq.job_state) s",
    );
    expect(total).toBe(9);
    expect(rows).toEqual([]);
  });

  it("jobs_traceparent_w3c: valid ids, all-zero ids, each wrong part, and NULL", async () => {
    const samples = [
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "00-00000000000000000000000000000001-0000000000000001-00",
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
      "00-00000000000000000000000000000000-0000000000000000-01",
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
      "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
      "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
      "x00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "",
      null,
    ];
    const grid = `SELECT t AS traceparent FROM unnest(ARRAY[${samples.map((s) => (s === null ? "NULL" : `'${s}'`)).join(", ")}]::text[]) t`;
    const { rows, total } = await disagreements(
      "jobs_traceparent_w3c",
      `traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
         AND substr(traceparent, 4, 32) <> '00000000000000000000000000000000'
         AND substr(traceparent, 37, 16) <> '0000000000000000'`,
      grid,
    );
    expect(total).toBe(samples.length);
    expect(rows).toEqual([]);
    // The grid is not trivially agreeing: it holds both outcomes.
    const { rows: outcomes } = await db.pool.query<{ ok: boolean | null }>(`SELECT idemq._is_traceparent(g.traceparent) AS ok FROM (${grid}) g`);
    expect(outcomes.map((r) => r.ok)).toEqual([true, true, false, false, false, false, false, false, false, false, false, false, false, null]);
  });

  it("jobs_traceparent_w3c spells the regular expression of _is_traceparent, the rule's one definition", async () => {
    const check = await installed("jobs_traceparent_w3c");
    const { rows } = await db.pool.query<{ body: string }>(
      "SELECT pg_get_functiondef('idemq._is_traceparent(text)'::regprocedure) AS body",
    );
    const pattern = (text: string) => {
      const m = /~ '([^']+)'/.exec(text);
      expect(m, text).not.toBeNull();
      return m![1]!;
    };
    expect(check).toMatch(/^\(traceparent ~ '[^']+'::text\)$/);
    expect(rows[0]!.body).toMatch(/RETURN \(value ~ '[^']+'::text\)/);
    expect(pattern(check)).toBe(pattern(rows[0]!.body));
  });
});

describe("LIMIT_BOUNDS (src/contract.ts) are the bounds the CHECKs of idemq.limits hold", () => {
  /** Whether the installed CHECK `name` passes a row whose `column` is `value` (SQL literal). */
  async function passes(name: string, column: string, value: string): Promise<boolean> {
    const { rows } = await db.pool.query<{ ok: boolean }>(`SELECT coalesce((${await installed(name)}), true) AS ok FROM (SELECT ${value} AS ${column}) g`);
    return rows[0]!.ok;
  }

  it.each([
    ["limits_concurrency_range", "concurrency", LIMIT_BOUNDS.concurrency],
    ["limits_rate_range", "rate", LIMIT_BOUNDS.rate],
    ["limits_per_key_range", "per_key", LIMIT_BOUNDS.perKey],
  ] as const)("%s: %s from min to max, not one past either", async (name, column, { min, max }) => {
    expect(await passes(name, column, `${min - 1}`)).toBe(false);
    expect(await passes(name, column, `${min}`)).toBe(true);
    expect(await passes(name, column, `${max}`)).toBe(true);
    expect(await passes(name, column, `${max + 1}`)).toBe(false);
  });

  it("limits_per_at_least_a_second: per from perMinMs on", async () => {
    const ms = LIMIT_BOUNDS.perMinMs;
    expect(await passes("limits_per_at_least_a_second", "per", `interval '${ms - 1} milliseconds'`)).toBe(false);
    expect(await passes("limits_per_at_least_a_second", "per", `interval '${ms} milliseconds'`)).toBe(true);
  });
});
