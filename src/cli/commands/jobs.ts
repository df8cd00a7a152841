// idemq jobs [filter flags] [--limit N]      a table, newest first (find_jobs)
// idemq jobs show ID                          the job, a timeline of its attempts, its steps and children
// idemq jobs retry|cancel ID...               operator actions, one result per id
// idemq jobs retry|cancel|delete|run-now [ID...] <filter flags> | --all
//                                             a bulk action in batches, after a count and a question (jobs-bulk.ts)
// idemq jobs reschedule ID... --run-at T | --delay D
import { type Command, Option } from "commander";
import { CLIENT_DEFAULTS, type JobState } from "../../contract.ts";
import { DuplicateJobError, JobNotFoundError } from "../../errors.ts";
import type { Client } from "../../client.ts";
import { countJobs, type JobFilter, unlessRefused } from "../../job-reads.ts";
import { runQuery } from "../../sql/index.ts";
import { withClient } from "../connect.ts";
import { type CommonOptions, databaseCommand } from "../define.ts";
import { exitCodeFor } from "../exit-codes.ts";
import { JOB_COLUMNS, jobRow, renderJob, renderStepsAndChildren, retries, table, timeline } from "../format.ts";
import { action, emit, type ErrorJson, errorJson, errorLine, UsageError } from "../output.ts";
import { printable } from "../terminal-text.ts";
import { addFilterOptions, type FilterOptions, filterFrom, hasFilter } from "../job-filter.ts";
import { integerParser, parseDuration, parseInstant, parseJobId, parseJobIds } from "../parse.ts";
import { addBulkOptions, type BulkOptions, bulkFilter, runBulk } from "./jobs-bulk.ts";

interface ListOptions extends CommonOptions, FilterOptions {
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
  const jobs = addFilterOptions(
    program
      .command("jobs")
      .description("list jobs (newest first); show, retry, cancel, delete, run now or reschedule them")
      // Checked in the action, so `jobs frobnicate` names the subcommands rather than "too many arguments".
      .allowExcessArguments(),
  )
    .option("--limit <n>", `at most this many rows (default ${CLIENT_DEFAULTS.listLimit})`, integerParser("--limit", 1, 100_000))
    .action(
      action(async (_options: ListOptions, cmd: Command) => {
        const subcommand = cmd.args[0];
        if (subcommand !== undefined) {
          throw new UsageError(
            `unknown command 'jobs ${subcommand}'; use jobs show, retry, cancel, delete, run-now or reschedule (see \`idemq jobs --help\`)`,
          );
        }
        const options = cmd.optsWithGlobals<ListOptions>();
        const filter = filterFrom(options);
        await withClient(options, async (client) => {
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
    "idemq jobs --task send_email --payload '{\"customer\": 42}' --since 2h",
    "idemq jobs --state failed --error timeout --finished-since 1d",
    "idemq jobs show 42",
    "idemq jobs retry 42 43",
  ]);

  const show = jobs
    .command("show")
    .description("show a job and the timeline of its attempts (claimed when, by which worker, how it ended, the error), then its durable steps and its children")
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
          // null: the login's role may not read them (steps() is the worker's and admin's).
          const [steps, children] = await Promise.all([unlessRefused(client.steps(id)), unlessRefused(client.children(id))]);
          emit(
            options,
            { ...job, retries: retried, timeline: attempts, steps, children },
            [...renderJob(job, attempts, { retries: retried, stack: options.stack === true }), ...renderStepsAndChildren(steps, children)],
          );
        });
      }),
    );
  databaseCommand(show, ["idemq jobs show 42", "idemq jobs show 42 --stack", "idemq jobs show 42 --json | jq '.timeline[-1].error'"]);

  const retry = addBulkOptions(
    addFilterOptions(
      jobs
        .command("retry")
        .description("run failed, cancelled or expired jobs again, with fresh attempts: the ids given, or every job a filter matches")
        .argument("[ids...]", "job ids"),
    ),
  ).action(
    action(async (ids: string[], _options: BulkOptions, cmd: Command) => {
      await perIdOrBulk(cmd.optsWithGlobals<BulkOptions>(), ids, "retry", "retried", (client, id) => client.retry(id));
    }),
  );
  databaseCommand(retry, [
    "idemq jobs retry 42",
    "idemq jobs retry --state failed --task send_email --error timeout --finished-since 1d",
    "idemq jobs retry --queue emails --dry-run",
  ]);

  const cancel = addBulkOptions(
    addFilterOptions(
      jobs
        .command("cancel")
        .description("cancel jobs that have not finished (a running attempt is fenced out): the ids given, or every job a filter matches")
        .argument("[ids...]", "job ids"),
    ),
  ).action(
    action(async (ids: string[], _options: BulkOptions, cmd: Command) => {
      await perIdOrBulk(cmd.optsWithGlobals<BulkOptions>(), ids, "cancel", "cancelled", (client, id) => client.cancel(id));
    }),
  );
  databaseCommand(cancel, ["idemq jobs cancel 42 43 --json", "idemq jobs cancel --queue imports --state scheduled,enqueued --yes"]);

  const remove = addBulkOptions(
    addFilterOptions(
      jobs
        .command("delete")
        .description("delete finished jobs (their keys stay until prune-keys): the ids given, or every finished job a filter matches")
        .argument("[ids...]", "job ids"),
    ),
  ).action(
    action(async (ids: string[], _options: BulkOptions, cmd: Command) => {
      const options = cmd.optsWithGlobals<BulkOptions>();
      await runBulk("delete", bulkFilter(options, parseJobIds(ids)), options);
    }),
  );
  databaseCommand(remove, ["idemq jobs delete --state failed --task import --finished-until 30d", "idemq jobs delete 42 43 --yes --json"]);

  const runNow = addBulkOptions(
    addFilterOptions(
      jobs
        .command("run-now")
        .description("enqueue scheduled jobs now (reschedule to now): the ids given, or every scheduled job a filter matches")
        .argument("[ids...]", "job ids"),
    ),
  ).action(
    action(async (ids: string[], _options: BulkOptions, cmd: Command) => {
      const options = cmd.optsWithGlobals<BulkOptions>();
      await runBulk("run_now", bulkFilter(options, parseJobIds(ids)), options);
    }),
  );
  databaseCommand(runNow, ["idemq jobs run-now --queue reports", "idemq jobs run-now 42 --yes"]);

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


/**
 * retry and cancel: ids alone act on each id in turn, one result per id, as
 * before; with a filter flag, --all, --yes, --dry-run or --batch-size it is
 * the bulk action on the ids and filter together (jobs-bulk.ts).
 */
async function perIdOrBulk(
  options: BulkOptions,
  ids: string[],
  bulk: "retry" | "cancel",
  verb: string,
  run: (client: Client, id: string) => Promise<JobState>,
): Promise<void> {
  const jobIds = parseJobIds(ids);
  const bulkFlags = options.all || options.yes || options.dryRun || options.batchSize !== undefined;
  if (jobIds.length > 0 && !hasFilter(options) && !bulkFlags) {
    await forEachJob(options, jobIds, verb, run);
    return;
  }
  await runBulk(bulk, bulkFilter(options, jobIds), options);
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

async function countBeyond(client: Client, filter: JobFilter, limit: number): Promise<{ count: number; exact: boolean }> {
  const { count, exact } = await countJobs(client.pool, filter, limit + MORE_COUNT_CAP);
  return { count: count - limit, exact };
}

/** "Stopped at --limit 100: 37 more match; ..." (or "10,000+ more"). */
function moreLine(limit: number, beyond: { count: number; exact: boolean }): string {
  const more = `${beyond.count.toLocaleString("en-US")}${beyond.exact ? "" : "+"}`;
  return `Stopped at --limit ${limit}: ${more} more match; raise --limit or narrow the filters.`;
}
