// The limits a worker's tasks declare (concurrencyLimit, rateLimit), applied
// when it starts, after its schedules and before its first claim, through
// declare_limit: lower-only, so workers that disagree during a rolling deploy
// leave the lowest declared limit stored and nothing runs over it; raising
// one is an operator's act (docs/worker.md, "Declared limits"). A login that
// may not call declare_limit (a role without this installation's worker
// role's grants, or a schema before it) gets one warning per task and the
// worker runs on; a value SQL refuses stops the start, naming the task.
import type pg from "pg";
import { toMilliseconds } from "../duration.ts";
import { BadArgumentError } from "../errors.ts";
import * as sql from "../sql/index.ts";
import type { Queryable } from "../sql/index.ts";
import type { LogEntry } from "./events.ts";
import type { DeclaredLimits, NormalizedTask } from "./task-config.ts";

/** SQLSTATEs that mean "this login cannot declare": insufficient_privilege, undefined_function. */
const CANNOT_DECLARE = new Set(["42501", "42883"]);

function describeLimits(limits: { concurrency?: number | null; rate?: number | null; per?: string | null }): string {
  const parts: string[] = [];
  if (limits.concurrency !== undefined && limits.concurrency !== null) parts.push(`concurrency ${limits.concurrency}`);
  if (limits.rate !== undefined && limits.rate !== null) parts.push(`rate ${limits.rate} per ${limits.per}`);
  return parts.length === 0 ? "none" : parts.join(", ");
}

function cliFix(task: string, limits: DeclaredLimits): string {
  return [
    `idemq limit set --task ${task}`,
    limits.concurrency === undefined ? "" : ` --concurrency ${limits.concurrency}`,
    limits.rate === undefined ? "" : ` --rate ${limits.rate} --per '${limits.per}'`,
  ].join("");
}

/** Whether PostgreSQL's text of an interval ("00:01:00") and the declared one ("1 minute") are one period. */
function samePeriod(stored: string | null, declared: string): boolean {
  if (stored === null) return false;
  try {
    return toMilliseconds(stored) === toMilliseconds(declared);
  } catch {
    return stored === declared;
  }
}

/** Applies each task's declared limits in task name order; logs what each did. */
export async function declareLimits(
  pool: pg.Pool,
  tasks: ReadonlyMap<string, NormalizedTask>,
  timeoutMs: number,
  log: (entry: LogEntry) => void,
  workerId: string,
): Promise<void> {
  const declared = [...tasks.values()].filter((t) => t.limits !== undefined).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  if (declared.length === 0) return;
  // runQuery passes a config object when it sets `types` (declare_limit's interval as text).
  const timed: Queryable = {
    query: (text: string | pg.QueryConfig, values?: unknown[]) =>
      pool.query({ ...(typeof text === "string" ? { text, values } : text), query_timeout: timeoutMs } as unknown as pg.QueryConfig) as Promise<pg.QueryResult>,
  } as Queryable;
  for (const task of declared) {
    const limits = task.limits!;
    let stored: sql.DeclaredLimit;
    try {
      stored = await sql.declareLimit(timed, { task: task.name, ...limits });
    } catch (error) {
      // pg's error as it came (42501 is not one of idemq's), or an IdemqError (42883 names a schema before 0.2.0).
      const code = (error as { code?: unknown }).code;
      if (typeof code === "string" && CANNOT_DECLARE.has(code)) {
        log({
          level: "warn",
          workerId,
          message:
            `task "${task.name}" declares ${describeLimits(limits)} but this worker's database role may not apply it (${code}: ${(error as Error).message}); ` +
            `it runs on under the limits stored now: grant the login this installation's worker role (\`idemq roles grant ROLE --worker\`) or set them as an operator (\`${cliFix(task.name, limits)}\`)`,
          task: task.name,
        });
        continue;
      }
      if (error instanceof BadArgumentError) {
        throw new BadArgumentError(
          `task "${task.name}"'s declared limits: ${error.message}`,
          { code: error.code, detail: error.detail, hint: error.hint },
          { cause: error },
        );
      }
      throw error;
    }
    const kept =
      (limits.concurrency !== undefined && stored.concurrency !== limits.concurrency) ||
      (limits.rate !== undefined && (stored.rate !== limits.rate || !samePeriod(stored.per, limits.per!)));
    log({
      level: "info",
      workerId,
      message: kept
        ? `task "${task.name}" declares ${describeLimits(limits)}; the stored ${describeLimits(stored)} is kept where it is lower (a worker never raises a limit)`
        : `task "${task.name}": ${stored.applied ? "applied" : "already stored"} ${describeLimits(limits)}`,
      task: task.name,
      declared: limits,
      stored: { concurrency: stored.concurrency, rate: stored.rate, per: stored.per },
    });
  }
}
