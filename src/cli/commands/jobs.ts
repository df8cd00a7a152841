// idemq jobs [--state S] [--queue Q] [--task T] [--key K] [--limit N]   a table, newest first
// idemq jobs show ID                          the job and a timeline of its attempts
// idemq jobs retry|cancel ID...               operator actions, one result per id
// idemq jobs reschedule ID... --run-at T | --delay D
import { type Command, Option } from "commander";
import { CLIENT_DEFAULTS, JOB_STATES, type JobState } from "../../contract.ts";
import { DuplicateJobError, JobNotFoundError } from "../../errors.ts";
import type { Client } from "../../client.ts";
import { countJobs, type ListJobsFilter } from "../../job-reads.ts";
import { runQuery } from "../../sql/index.ts";
import { withClient } from "../connect.ts";
import { type CommonOptions, databaseCommand } from "../define.ts";
import { exitCodeFor } from "../exit-codes.ts";
import { JOB_COLUMNS, jobRow, renderJob, retries, table, timeline } from "../format.ts";
import { action, emit, type ErrorJson, errorJson, errorLine, UsageError } from "../output.ts";
import { printable } from "../terminal-text.ts";
import { integerParser, parseDuration, parseInstant, parseJobId, parseJobIds, parseStates } from "../parse.ts";

interface ListOptions extends CommonOptions {
  state?: JobState[];
  queue?: string;
  task?: string;
  key?: string;
  limit?: number;
}

interface ShowOptions extends CommonOptions {
  stack?: boolean;
}

interface RescheduleOptions extends CommonOptions {
  runAt?: Date;
  delay?: string;
}

export function registerJobsCommands(program: Command): void {
  const jobs = program
    .command("jobs")
    .description("list jobs (newest first); show, retry, cancel or reschedule them")
    // Checked in the action, so `jobs frobnicate` names the subcommands rather than "too many arguments".
    .allowExcessArguments()
    .option("--state <states>", `comma-separated states: ${JOB_STATES.join(", ")}`, parseStates)
    .option("--queue <queue>", "only this queue")
    .option("--task <task>", "only this task")
    .option("--key <key>", "only the job with this idempotency key")
    .option("--limit <n>", `at most this many rows (default ${CLIENT_DEFAULTS.listLimit})`, integerParser("--limit", 1, 100_000))
    .action(
      action(async (_options: ListOptions, cmd: Command) => {
        const subcommand = cmd.args[0];
        if (subcommand !== undefined) {
          throw new UsageError(`unknown command 'jobs ${subcommand}'; use jobs show, retry, cancel or reschedule (see \`idemq jobs --help\`)`);
        }
        const options = cmd.optsWithGlobals<ListOptions>();
        await withClient(options, async (client) => {
          const filter = {
            ...(options.state === undefined ? {} : { state: options.state }),
            ...(options.queue === undefined ? {} : { queue: options.queue }),
            ...(options.task === undefined ? {} : { task: options.task }),
            ...(options.key === undefined ? {} : { key: options.key }),
          };
          const limit = options.limit ?? CLIENT_DEFAULTS.listLimit;
          const found = await client.listJobs({ ...filter, limit });
          const beyond = found.length < limit ? { count: 0, exact: true } : await countBeyond(client, filter, limit);
          const now = Date.now();
          const rows = found.length === 0 ? ["No jobs match."] : table(JOB_COLUMNS, found.map((job) => jobRow(job, now)), [0]);
          if (beyond.count > 0) rows.push(moreLine(limit, beyond));
          emit(options, { jobs: found, limit, more: beyond.count, moreExact: beyond.exact }, rows);
        });
      }),
    );
  databaseCommand(jobs, [
    "idemq jobs --state failed,expired --queue emails",
    "idemq jobs --key invoice:42 --json",
    "idemq jobs show 42",
    "idemq jobs retry 42 43",
  ]);

  const show = jobs
    .command("show")
    .description("show a job and the timeline of its attempts: claimed when, by which worker, how it ended, the error")
    .argument("<id>", "job id", parseJobId)
    .option("--stack", "print each failed attempt's stack trace under it (--json always has them, in errors)")
    .action(
      action(async (id: string, _options: ShowOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<ShowOptions>();
        await withClient(options, async (client) => {
          const job = await client.getJob(id);
          if (job === null) throw new JobNotFoundError(`no job ${id}`, { hint: "idemq jobs lists the jobs there are" });
          const attempts = timeline(job);
          const retried = retries(job);
          emit(
            options,
            { ...job, retries: retried, timeline: attempts },
            renderJob(job, attempts, { retries: retried, stack: options.stack === true }),
          );
        });
      }),
    );
  databaseCommand(show, ["idemq jobs show 42", "idemq jobs show 42 --stack", "idemq jobs show 42 --json | jq '.timeline[-1].error'"]);

  const retry = jobs
    .command("retry")
    .description("run failed, cancelled or expired jobs again, with fresh attempts")
    .argument("<ids...>", "job ids")
    .action(
      action(async (ids: string[], _options: CommonOptions, cmd: Command) => {
        await forEachJob(cmd.optsWithGlobals<CommonOptions>(), parseJobIds(ids), "retried", (client, id) => client.retry(id));
      }),
    );
  databaseCommand(retry, ["idemq jobs retry 42", "idemq jobs retry $(idemq jobs --state failed --json | jq -r '.jobs[].id')"]);

  const cancel = jobs
    .command("cancel")
    .description("cancel jobs that have not finished (a running attempt is fenced out)")
    .argument("<ids...>", "job ids")
    .action(
      action(async (ids: string[], _options: CommonOptions, cmd: Command) => {
        await forEachJob(cmd.optsWithGlobals<CommonOptions>(), parseJobIds(ids), "cancelled", (client, id) => client.cancel(id));
      }),
    );
  databaseCommand(cancel, ["idemq jobs cancel 42 43 --json"]);

  const reschedule = jobs
    .command("reschedule")
    .description("move jobs that wait to run to another time")
    .argument("<ids...>", "job ids")
    .addOption(new Option("--run-at <time>", "new time (ISO 8601, or now)").argParser(parseInstant).conflicts("delay"))
    .addOption(new Option("--delay <duration>", "from now, by the database clock, e.g. 10m").argParser(parseDuration))
    .action(
      action(async (ids: string[], _options: RescheduleOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<RescheduleOptions>();
        const jobIds = parseJobIds(ids);
        if (options.runAt === undefined && options.delay === undefined) {
          throw new UsageError("reschedule needs --run-at <time> or --delay <duration>, e.g. --delay 10m");
        }
        await forEachJob(options, jobIds, "rescheduled", async (client, id) => {
          const runAt = options.runAt ?? (await databaseTimeIn(client, options.delay!));
          return client.reschedule(id, runAt);
        });
      }),
    );
  databaseCommand(reschedule, ["idemq jobs reschedule 42 --delay 10m", "idemq jobs reschedule 42 43 --run-at 2026-12-01T09:00:00Z"]);
}


interface JobResult {
  id: string;
  ok: boolean;
  state?: JobState;
  /** Why this id failed, in the shape of every --json error (errorJson). */
  error?: ErrorJson["error"];
}

/**
 * Runs the action on each id in turn. Each id stands alone: one that fails
 * (no such job, wrong state) does not stop the others. The exit code is that
 * of the first failure.
 */
async function forEachJob(
  options: CommonOptions,
  ids: readonly string[],
  verb: string,
  run: (client: Client, id: string) => Promise<JobState>,
): Promise<void> {
  await withClient(options, async (client) => {
    const results: JobResult[] = [];
    let firstFailure: unknown;
    for (const id of ids) {
      try {
        results.push({ id, ok: true, state: await run(client, id) });
      } catch (error) {
        const code = (error as { code?: unknown }).code;
        // A job the database does not answer for is not "bad input for one id": stop.
        if (typeof code !== "string" || (!code.startsWith("IQ") && !code.startsWith("22"))) throw error;
        firstFailure ??= error;
        const detail = code === "IQ409" ? keyHolder(error) : "";
        results.push({ id, ok: false, error: errorJson(error).error });
        process.stderr.write(`idemq: job ${id}: ${printable(errorLine(error) + detail)}\n`);
      }
    }
    emit(
      options,
      { results },
      results.filter((r) => r.ok).map((r) => `job ${r.id}: ${verb}, now ${r.state}`),
    );
    if (firstFailure !== undefined) process.exitCode = exitCodeFor(firstFailure);
  });
}

/** " (key K is held by job N)" from an IQ409's DETAIL. */
function keyHolder(error: unknown): string {
  if (error instanceof DuplicateJobError) return ` (key ${error.key} is held by job ${error.existingJobId})`;
  try {
    const detail = JSON.parse(String((error as { detail?: unknown }).detail)) as { key?: unknown; existing_job_id?: unknown };
    return detail.key === undefined ? "" : ` (key ${String(detail.key)} is held by job ${String(detail.existing_job_id)})`;
  } catch {
    return "";
  }
}

/** The database's now() + a duration, so a delay means the same as enqueue --delay. */
async function databaseTimeIn(client: Client, interval: string): Promise<Date> {
  const rows = await runQuery<{ at: Date }>(client.pool, "SELECT statement_timestamp() + $1::interval AS at", [interval]);
  return rows[0]!.at;
}

/**
 * How many more jobs match than the `limit` shown, counted up to
 * MORE_COUNT_CAP past it: a filter matching a million finished jobs reads
 * limit + MORE_COUNT_CAP + 1 rows, never all of them.
 */
export const MORE_COUNT_CAP = 10_000;

async function countBeyond(client: Client, filter: ListJobsFilter, limit: number): Promise<{ count: number; exact: boolean }> {
  const { count, exact } = await countJobs(client.pool, filter, limit + MORE_COUNT_CAP);
  return { count: count - limit, exact };
}

/** "Stopped at --limit 100: 37 more match; ..." (or "10,000+ more"). */
function moreLine(limit: number, beyond: { count: number; exact: boolean }): string {
  const more = `${beyond.count.toLocaleString("en-US")}${beyond.exact ? "" : "+"}`;
  return `Stopped at --limit ${limit}: ${more} more match; raise --limit or narrow the filters.`;
}
