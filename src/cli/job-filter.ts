// The job filter flags of `idemq jobs` (list) and of its bulk actions (jobs
// retry|cancel|delete|run-now): --state, --queue, --task, --key,
// --concurrency-key, --error, --payload, --since, --until, --finished-since,
// --finished-until. Each is read here, before any database is opened, so a
// bad one is one line and exit 2; what a filter may say is SQL's
// (sql/functions/search/_check_job_filter.sql), which checks it again.
import { type Command, InvalidArgumentError } from "commander";
import { JOB_STATES, type JobState } from "../contract.ts";
import type { JobFilter } from "../job-reads.ts";
import { UsageError } from "./output.ts";
import { toMilliseconds } from "../duration.ts";
import { parseJson, parseStates } from "./parse.ts";

export interface FilterOptions {
  state?: JobState[];
  queue?: string;
  task?: string;
  key?: string;
  concurrencyKey?: string;
  error?: string;
  payload?: string;
  since?: Date;
  until?: Date;
  finishedSince?: Date;
  finishedUntil?: Date;
}

/** A time flag: ISO 8601 (2026-12-01T09:00:00Z), or a duration meaning that long ago by this machine's clock (2h, 7d). */
function parseTime(flag: string): (value: string) => Date {
  return (value) => {
    const text = value.trim();
    if (/^\d{4}-\d{2}-\d{2}/.test(text)) {
      const date = new Date(text);
      if (!Number.isNaN(date.getTime())) return date;
    } else if (text !== "" && !/^\d+(\.\d+)?$/.test(text)) {
      try {
        return new Date(Date.now() - toMilliseconds(text));
      } catch {
        // reported below, with both forms
      }
    }
    throw new InvalidArgumentError(`${flag} takes a time (2026-12-01T09:00:00Z) or how long ago (30m, 2h, 7d), not "${value}"`);
  };
}

/** Adds the filter flags to `command`. */
export function addFilterOptions(command: Command): Command {
  return command
    .option("--state <states>", `comma-separated states: ${JOB_STATES.join(", ")}`, parseStates)
    .option("--queue <queue>", "only this queue")
    .option("--task <task>", "only this task")
    .option("--key <key>", "only the jobs with this idempotency key")
    .option("--concurrency-key <key>", "only the jobs with this concurrency key")
    .option("--error <text>", "text in the job's last error (class: message), any case")
    .option("--payload <json>", `JSON the payload contains, e.g. '{"customer": 42}' (needs --task or --key)`)
    .option("--since <time>", "created at or after: a time (2026-12-01T09:00:00Z) or how long ago (2h, 7d)", parseTime("--since"))
    .option("--until <time>", "created before: a time or how long ago", parseTime("--until"))
    .option("--finished-since <time>", "finished at or after: a time or how long ago", parseTime("--finished-since"))
    .option("--finished-until <time>", "finished before: a time or how long ago", parseTime("--finished-until"));
}

/** The JobFilter of the flags given (and of `ids`, when given); throws UsageError for a bad --payload. */
export function filterFrom(options: FilterOptions, ids: readonly string[] = []): JobFilter {
  const filter: JobFilter = {
    ...(ids.length === 0 ? {} : { ids }),
    ...(options.state === undefined ? {} : { state: options.state }),
    ...(options.queue === undefined ? {} : { queue: options.queue }),
    ...(options.task === undefined ? {} : { task: options.task }),
    ...(options.key === undefined ? {} : { key: options.key }),
    ...(options.concurrencyKey === undefined ? {} : { concurrencyKey: options.concurrencyKey }),
    ...(options.error === undefined ? {} : { errorText: options.error }),
    ...(options.since === undefined ? {} : { createdAfter: options.since }),
    ...(options.until === undefined ? {} : { createdBefore: options.until }),
    ...(options.finishedSince === undefined ? {} : { finishedAfter: options.finishedSince }),
    ...(options.finishedUntil === undefined ? {} : { finishedBefore: options.finishedUntil }),
  };
  if (options.payload !== undefined) {
    const payload = parseJson(options.payload, "--payload");
    if (payload === null || typeof payload !== "object" || Array.isArray(payload)) {
      throw new UsageError(`--payload must be a JSON object, e.g. '{"customer": 42}', not ${options.payload}`);
    }
    // SQL's rule (_check_job_filter): a payload match needs task, key or ids beside it.
    if (filter.task === undefined && filter.key === undefined && ids.length === 0) {
      throw new UsageError("--payload needs --task (or --key, or job ids) beside it: a payload's shape is its task's");
    }
    filter.payload = payload as Record<string, unknown>;
  }
  return filter;
}

const FILTER_FLAGS = [
  "state", "queue", "task", "key", "concurrencyKey", "error", "payload", "since", "until", "finishedSince", "finishedUntil",
] as const satisfies readonly (keyof FilterOptions)[];

/** Whether any filter flag was given. */
export function hasFilter(options: FilterOptions): boolean {
  return FILTER_FLAGS.some((flag) => options[flag] !== undefined);
}
