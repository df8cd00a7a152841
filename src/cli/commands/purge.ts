// idemq purge --older-than 7d [--state succeeded,...] [--batch-size 1000]:
// deletes finished jobs in batches, each its own short transaction, so an
// interrupted purge keeps what it deleted and holds no lock for long. Their
// idempotency keys stay in the ledger until prune-keys releases them.
//
// Ctrl-C (SIGINT, and SIGTERM/SIGHUP alike) stops at the end of the batch in
// flight: the batches done stay done, the rest of the jobs stay in place, the
// answer says how many were removed, and the exit code is 128 + the signal
// (130 for Ctrl-C), as for any command a signal stopped. A second signal
// exits at once; the batch in flight then commits or rolls back on its own.
import type { Command } from "commander";
import { type JobState, TERMINAL_STATES, isTerminalState } from "../../contract.ts";
import { MAX_DELETE_BATCH } from "../../worker/defaults.ts";
import { withClient } from "../connect.ts";
import { type CommonOptions, databaseCommand } from "../define.ts";
import { SIGNAL_EXIT } from "../exit-codes.ts";
import { action, emit, UsageError } from "../output.ts";
import { integerParser, parseDuration, parseStates } from "../parse.ts";
import { progressLine } from "../progress.ts";

interface Options extends CommonOptions {
  olderThan: string;
  state?: JobState[];
  batchSize: number;
}

const SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
type StopSignal = (typeof SIGNALS)[number];

/** The CLI's batch when --batch-size is left out. */
const DEFAULT_BATCH = 1000;

export function registerPurgeCommand(program: Command): void {
  const command = program
    .command("purge")
    .description("delete finished jobs that finished more than a while ago, in batches (keys stay until prune-keys)")
    .requiredOption("--older-than <duration>", "finished more than this long ago, e.g. 7d", parseDuration)
    .option("--state <states>", `only these finished states (default all: ${TERMINAL_STATES.join(", ")})`, parseStates)
    .option(
      "--batch-size <n>",
      `jobs deleted per transaction, 1..${MAX_DELETE_BATCH}`,
      integerParser("--batch-size", 1, MAX_DELETE_BATCH),
      DEFAULT_BATCH,
    )
    .action(
      action(async (_options: Options, cmd: Command) => {
        const options = cmd.optsWithGlobals<Options>();
        const active = options.state?.filter((state) => !isTerminalState(state)) ?? [];
        if (active.length > 0) {
          throw new UsageError(
            `purge deletes finished jobs only, not ${active.join(", ")}; use --state with ${TERMINAL_STATES.join(", ")}`,
          );
        }
        const states = options.state ?? null;
        const shown = (states ?? TERMINAL_STATES).join(", ");
        await withClient(options, async (client) => {
          const progress = progressLine(options, `purging jobs finished more than ${options.olderThan} ago`);
          let caught: StopSignal | undefined;
          const onSignal = (signal: StopSignal): void => {
            if (caught !== undefined) process.exit(SIGNAL_EXIT[signal]);
            caught = signal;
            progress.note("stopping after this batch");
          };
          for (const signal of SIGNALS) process.on(signal, onSignal);
          let purged = 0;
          let batches = 0;
          try {
            for (;;) {
              const n = await client.purge({
                olderThan: options.olderThan,
                batchSize: options.batchSize,
                ...(states === null ? {} : { states }),
              });
              purged += n;
              batches += 1;
              progress.update(`${purged} job(s) removed in ${batches} batch(es)`);
              if (n < options.batchSize || caught !== undefined) break;
            }
          } finally {
            for (const signal of SIGNALS) process.off(signal, onSignal);
            progress.end();
          }
          const interrupted = caught !== undefined;
          emit(
            options,
            { purged, olderThan: options.olderThan, states: states ?? [...TERMINAL_STATES], batches, interrupted },
            interrupted
              ? `Interrupted (${caught}): purged ${purged} job(s) (${shown}) finished more than ${options.olderThan} ago ` +
                  `in ${batches} batch(es); the rest stay, run the command again to go on. ` +
                  "Their keys stay until `idemq prune-keys`."
              : `Purged ${purged} job(s) (${shown}) finished more than ${options.olderThan} ago; ` +
                  "their keys stay until `idemq prune-keys`.",
          );
          if (caught !== undefined) process.exitCode = SIGNAL_EXIT[caught];
        });
      }),
    );
  command.addHelpText(
    "after",
    "\nEach batch is its own transaction. Ctrl-C stops after the batch in flight: the batches done stay\n" +
      "done, the rest of the jobs stay, the answer (and --json, with \"interrupted\": true) says how many\n" +
      "were removed, and the exit code is 130. A second Ctrl-C exits at once.",
  );
  databaseCommand(command, [
    "idemq purge --older-than 7d",
    "idemq purge --older-than 1d --state succeeded --json",
    "idemq purge --older-than 30d --batch-size 500   # Ctrl-C stops after the batch in flight",
  ]);
}
