// The worker's declarative schedules (createWorker({ schedules })): checked
// when the worker is created, upserted by name when it starts, before it
// claims. Schedules the list does not name are left alone: they may belong to
// another application or worker, or have been added with `idemq schedules
// add`, and nothing records which worker declared which schedule, so only an
// explicit unschedule removes one (docs/worker.md, "Schedules").
import type pg from "pg";
import { BadArgumentError, IdemqError } from "../errors.ts";
import * as sql from "../sql/index.ts";
import type { Queryable, ScheduleDefinition } from "../sql/index.ts";
import { WorkerConfigError } from "./task-config.ts";

/** Checks the `schedules` option without a database: a list of schedule() definitions with distinct names. */
export function normalizeSchedules(schedules: unknown): ScheduleDefinition[] {
  if (schedules === undefined) return [];
  if (!Array.isArray(schedules)) {
    throw new WorkerConfigError("schedules must be an array of { name, cron, task, ... } (leave it out for none)");
  }
  const seen = new Set<string>();
  return schedules.map((definition: ScheduleDefinition, i) => {
    try {
      sql.checkSchedule(definition);
    } catch (error) {
      const message = error instanceof IdemqError && error.hint ? `${error.message} (${error.hint})` : (error as Error).message;
      throw new WorkerConfigError(`schedules[${i}]: ${message}`, { cause: error });
    }
    if (seen.has(definition.name)) {
      throw new WorkerConfigError(`schedules[${i}]: the name ${JSON.stringify(definition.name)} is declared twice; give each schedule its own name`);
    }
    seen.add(definition.name);
    return { ...definition };
  });
}

/**
 * Upserts the schedules in one transaction, in name order: all or none are
 * written (a bad cron in the third leaves the first two as they were), and
 * workers starting at once take the rows' locks in the same order, so they
 * cannot deadlock. Re-declaring a schedule unchanged keeps its next slot
 * (schedule() keeps next_at while cron and time zone are the same, and
 * writes nothing for an unchanged definition), so a restart or a second
 * worker creates no job and loses no due slot. A value SQL refuses is a
 * BadArgumentError naming the schedule.
 */
export async function declareSchedules(pool: pg.Pool, schedules: readonly ScheduleDefinition[], timeoutMs: number): Promise<void> {
  if (schedules.length === 0) return;
  const ordered = [...schedules].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  let broken: Error | undefined;
  const client = await pool.connect();
  // pg-pool drops its idle listener at checkout: a terminated connection must not end the process.
  const onError = (error: Error): void => {
    broken ??= error;
  };
  client.on("error", onError);
  const timed: Queryable = {
    query: (text: string, values?: unknown[]) =>
      client.query({ text, values, query_timeout: timeoutMs } as unknown as pg.QueryConfig) as Promise<pg.QueryResult>,
  };
  try {
    await timed.query("BEGIN");
    for (const definition of ordered) {
      try {
        await sql.schedule(timed, definition);
      } catch (error) {
        if (error instanceof BadArgumentError) {
          throw new BadArgumentError(
            `schedule ${JSON.stringify(definition.name)} of the worker's schedules: ${error.message}`,
            { code: error.code, detail: error.detail, hint: error.hint },
            { cause: error },
          );
        }
        throw error;
      }
    }
    await timed.query("COMMIT");
  } catch (error) {
    await client.query("ROLLBACK").catch(() => {});
    broken ??= error as Error;
    throw error;
  } finally {
    client.removeListener("error", onError);
    // A failed transaction's connection is discarded rather than reused.
    client.release(broken);
  }
}
