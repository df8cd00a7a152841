// idemq enqueue TASK [PAYLOAD] [--key K] [--policy P] [--queue Q] [--run-at T | --delay D]
//   [--priority N] [--max-attempts N] [--after ID,...]
//
// PAYLOAD is JSON text, @file.json, or - for stdin. A rejection by the
// duplicate policy (IQ409) prints the job holding the key and exits 3; a key
// reused for different work (IQ422) prints that job and exits 4.
import { type Command, Option } from "commander";
import { DUPLICATE_POLICIES, type DuplicatePolicy } from "../../contract.ts";
import { DuplicateJobError, KeyReuseError } from "../../errors.ts";
import type { EnqueueOptions } from "../../sql/index.ts";
import { withClient } from "../connect.ts";
import { type CommonOptions, databaseCommand } from "../define.ts";
import { jobLine, relative } from "../format.ts";
import { action, emit, reportError } from "../output.ts";
import { printable } from "../terminal-text.ts";
import { integerParser, parseDuration, parseInstant, parseJobIdList, readPayload } from "../parse.ts";

interface Options extends CommonOptions {
  key?: string;
  policy?: DuplicatePolicy;
  queue?: string;
  runAt?: Date;
  delay?: string;
  priority?: number;
  maxAttempts?: number;
  after?: string[];
}

export function registerEnqueueCommand(program: Command): void {
  const command = program
    .command("enqueue")
    .description("add a job (with an idempotency key: at most one active job per key)")
    .argument("<task>", "task name, as the worker's tasks module names it")
    .argument("[payload]", "JSON payload: JSON text, @file.json, or - for stdin (default {})")
    .option("--key <key>", "idempotency key: an active job with this key is returned instead of a new one")
    .addOption(
      new Option("--policy <policy>", "what a finished job with the same key allows (default allow_after_failed)").choices(
        DUPLICATE_POLICIES,
      ),
    )
    .option("--queue <queue>", "queue name (default: default)")
    .addOption(new Option("--run-at <time>", "run at this time (ISO 8601, e.g. 2026-12-01T09:00:00Z)").argParser(parseInstant).conflicts("delay"))
    .addOption(new Option("--delay <duration>", "run after this long, e.g. 30s, 5m, 2h").argParser(parseDuration))
    .option("--priority <n>", "higher runs first (default 0)", integerParser("--priority", -2_147_483_648))
    .option("--max-attempts <n>", "attempts before the job fails (default 10)", integerParser("--max-attempts", 1))
    .option("--after <ids>", "comma-separated parent job ids: run once they all succeeded", parseJobIdList)
    .action(
      action(async (task: string, payloadArgument: string | undefined, _options: Options, cmd: Command) => {
        const options = cmd.optsWithGlobals<Options>();
        const payload = await readPayload(payloadArgument);
        const enqueueOptions: EnqueueOptions = {
          ...(options.key === undefined ? {} : { idempotencyKey: options.key }),
          ...(options.policy === undefined ? {} : { duplicatePolicy: options.policy }),
          ...(options.queue === undefined ? {} : { queue: options.queue }),
          ...(options.runAt === undefined ? {} : { runAt: options.runAt }),
          ...(options.delay === undefined ? {} : { delay: options.delay }),
          ...(options.priority === undefined ? {} : { priority: options.priority }),
          ...(options.maxAttempts === undefined ? {} : { maxAttempts: options.maxAttempts }),
          ...(options.after === undefined ? {} : { after: options.after }),
        };
        await withClient(options, async (client) => {
          try {
            const result = await client.enqueue(task, payload, enqueueOptions);
            const job = await client.getJob(result.jobId);
            const when = job && (job.state === "scheduled" ? ` (runs ${relative(job.runAt)})` : "");
            emit(
              options,
              { jobId: result.jobId, deduplicated: result.deduplicated, job },
              result.deduplicated
                ? `deduplicated: key ${printable(options.key ?? "")} is held by ${job ? jobLine(job) : `job ${result.jobId}`}; nothing enqueued`
                : `enqueued ${job ? jobLine(job) : `job ${result.jobId}`}${when ?? ""}`,
            );
          } catch (error) {
            if (!(error instanceof DuplicateJobError || error instanceof KeyReuseError)) throw error;
            // The job holding the key: on stdout as a line, or in the --json error object.
            const existing = await client.getJob(error.existingJobId);
            if (!options.json) {
              emit(options, null, existing ? jobLine(existing) : `job ${error.existingJobId} (purged; its key is kept until prune-keys)`);
            }
            reportError(error, options, { existingJob: existing });
          }
        });
      }),
    );
  databaseCommand(command, [
    `idemq enqueue send_invoice '{"orderId": 42}' --key invoice:42 --policy reject_if_succeeded`,
    "idemq enqueue import_supplier @supplier.json --queue imports --delay 5m",
    "echo '{\"account\": 7}' | idemq enqueue credit - --max-attempts 3 --json",
    "",
    `Policies: ${DUPLICATE_POLICIES.join(", ")}.`,
    "Exit codes: 0 enqueued or deduplicated, 3 rejected by the policy (IQ409),",
    "4 key reused for a different task or payload (IQ422), 2 bad input.",
  ]);
}
