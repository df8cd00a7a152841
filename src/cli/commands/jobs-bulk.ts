// idemq jobs retry|cancel|delete|run-now <filter flags>: a bulk action on
// every job the filter matches. It first says how many jobs the action will
// take (count_jobs with the action, so only the jobs in the states it takes)
// and asks (--yes skips the question, --dry-run stops there), then works in
// batches (retry_jobs, cancel_jobs, delete_jobs, run_jobs_now), each its own
// short transaction, with progress on stderr. Ctrl-C stops after the batch in
// flight, as `idemq purge` does.
import { type Command, Option } from "commander";
import { createInterface } from "node:readline/promises";
import type { BulkAction } from "../../contract.ts";
import type { JobFilter } from "../../job-reads.ts";
import { withClient } from "../connect.ts";
import type { CommonOptions } from "../define.ts";
import { SIGNAL_EXIT } from "../exit-codes.ts";
import { type FilterOptions, filterFrom, hasFilter } from "../job-filter.ts";
import { emit, UsageError } from "../output.ts";
import { integerParser } from "../parse.ts";
import { progressLine } from "../progress.ts";

export interface BulkOptions extends CommonOptions, FilterOptions {
  all?: boolean;
  yes?: boolean;
  dryRun?: boolean;
  batchSize?: number;
}

/** How far the confirmation counts: "100,000+ jobs" beyond it. */
export const CONFIRM_COUNT_CAP = 100_000;

/** A bulk action's words: the verb of the question and the past tense of the answer. */
const WORDS: Record<BulkAction, { verb: string; done: string; which: string }> = {
  retry: { verb: "Retry", done: "Retried", which: "failed, cancelled or expired" },
  cancel: { verb: "Cancel", done: "Cancelled", which: "active" },
  delete: { verb: "Delete", done: "Deleted", which: "finished" },
  run_now: { verb: "Run now", done: "Ran now", which: "scheduled" },
};

const SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
type StopSignal = (typeof SIGNALS)[number];

/** Adds --all, --yes, --dry-run and --batch-size to a bulk command. */
export function addBulkOptions(command: Command): Command {
  return command
    .option("--all", "every job the action takes, with no filter")
    .option("--yes", "act without asking (the count is still printed)")
    .option("--dry-run", "print how many jobs would be taken, and change nothing")
    .addOption(new Option("--batch-size <n>", "jobs per transaction, 1..10000 (default 1000)").argParser(integerParser("--batch-size", 1, 10_000)));
}

/** The filter of a bulk command: ids and flags, or --all; refuses an empty one (exit 2) before connecting. */
export function bulkFilter(options: BulkOptions, ids: readonly string[]): JobFilter {
  const given = ids.length > 0 || hasFilter(options);
  if (given && options.all) throw new UsageError("--all takes every job: give it alone, without ids or filter flags");
  if (!given && !options.all) {
    throw new UsageError("give job ids, filter flags (--state, --queue, --task, --error, ...) or --all for every job");
  }
  return filterFrom(options, ids);
}

export async function runBulk(action: BulkAction, filter: JobFilter, options: BulkOptions): Promise<void> {
  const words = WORDS[action];
  await withClient(options, async (client) => {
    const { count, exact } = await client.countJobs(filter, { action, atMost: CONFIRM_COUNT_CAP });
    const matched = `${count.toLocaleString("en-US")}${exact ? "" : "+"} ${words.which} job${count === 1 && exact ? "" : "s"}`;
    const match = count === 1 && exact ? "matches" : "match";
    const summary = { action, matched: count, matchedExact: exact };
    if (count === 0) {
      emit(options, { ...summary, touched: 0, skipped: 0, batches: 0, dryRun: options.dryRun === true, interrupted: false }, `No ${words.which} jobs match; nothing to do.`);
      return;
    }
    if (options.dryRun) {
      emit(options, { ...summary, dryRun: true }, `${words.verb}: ${matched} ${match} (dry run: nothing changed).`);
      return;
    }
    if (!options.yes && !(await confirm(`${words.verb} ${matched}? [y/N] `))) {
      throw new UsageError(`not confirmed: nothing changed (${matched} ${match}); --yes acts without asking`);
    }
    const progress = progressLine(options, `${words.verb.toLowerCase()} ${matched}`);
    let caught: StopSignal | undefined;
    const onSignal = (signal: StopSignal): void => {
      if (caught !== undefined) process.exit(SIGNAL_EXIT[signal]);
      caught = signal;
      progress.note("stopping after this batch");
    };
    for (const signal of SIGNALS) process.on(signal, onSignal);
    let result;
    try {
      result = await client.bulkAction(action, filter, {
        maxJobs: options.batchSize,
        onBatch: (p) => progress.update(`${p.touched} done, ${p.skipped} skipped, in ${p.batches} batch(es)`),
        stop: () => caught !== undefined,
      });
    } finally {
      for (const signal of SIGNALS) process.off(signal, onSignal);
      progress.end();
    }
    const skipped = result.skipped === 0 ? "" : `; ${result.skipped} skipped (they moved on since they matched, or a worker held them)`;
    const stopped = caught === undefined ? "" : `Interrupted (${caught}): `;
    emit(
      options,
      { ...summary, touched: result.touched, skipped: result.skipped, batches: result.batches, dryRun: false, interrupted: result.interrupted },
      `${stopped}${words.done} ${result.touched} job(s) in ${result.batches} batch(es)${skipped}.`,
    );
    if (caught !== undefined) process.exitCode = SIGNAL_EXIT[caught];
  });
}

/** Asks on stderr, reads one line of stdin: y or yes goes on; anything else, or no answer, does not. */
async function confirm(question: string): Promise<boolean> {
  const rl = createInterface({ input: process.stdin, output: process.stderr, terminal: false });
  try {
    process.stderr.write(question);
    const answer = await new Promise<string>((resolve) => {
      rl.once("line", resolve);
      rl.once("close", () => resolve(""));
    });
    // A terminal echoed the answer and its newline; a pipe did not.
    if (process.stdin.isTTY !== true) process.stderr.write("\n");
    return /^\s*y(es)?\s*$/i.test(answer);
  } finally {
    rl.close();
  }
}
