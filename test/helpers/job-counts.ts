// The kept job counts (idemq.job_counts, summed by idemq._job_counts()) against
// a count of the jobs table, read in one statement so both see one snapshot.
import { expect } from "vitest";
import type { Queryable } from "./jobs.ts";

export type CountRow = [queue: string, task: string, state: string, jobs: number];

/** The kept counts and a count(*) of idemq.jobs per (queue, task, state), from one snapshot. */
export async function keptAndCounted(db: Queryable): Promise<{ kept: CountRow[]; counted: CountRow[] }> {
  const { rows } = await db.query<{ kept: CountRow[] | null; counted: CountRow[] | null }>(
    `SELECT (SELECT json_agg(json_build_array(c.queue, c.task, c.state, c.jobs) ORDER BY c.queue, c.task, c.state)
               FROM idemq._job_counts() c) AS kept,
            (SELECT json_agg(json_build_array(j.queue, j.task, j.state, j.n) ORDER BY j.queue, j.task, j.state)
               FROM (SELECT queue, task, state, count(*) AS n FROM idemq.jobs GROUP BY 1, 2, 3) j) AS counted`,
  );
  return { kept: rows[0]!.kept ?? [], counted: rows[0]!.counted ?? [] };
}

/** Asserts that the kept counts equal a count of the table; returns them. */
export async function expectCountsExact(db: Queryable, when = ""): Promise<CountRow[]> {
  const { kept, counted } = await keptAndCounted(db);
  expect(kept, `kept counts against count(*) of idemq.jobs${when ? ` ${when}` : ""}`).toEqual(counted);
  return kept;
}

/** How many rows idemq.job_counts holds (what stats() sums). */
export async function countRows(db: Queryable): Promise<number> {
  const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM idemq.job_counts");
  return rows[0]!.n;
}
