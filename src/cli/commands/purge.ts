// idemq purge --older-than 7d [--state succeeded,...]: deletes finished jobs.
// Their idempotency keys stay in the ledger until prune-keys releases them.
import type { Command } from "commander";
import { type JobState, TERMINAL_STATES, isTerminalState } from "../../contract.ts";
import { withClient } from "../connect.ts";
import { type CommonOptions, databaseCommand } from "../define.ts";
import { action, emit, UsageError } from "../output.ts";
import { parseDuration, parseStates } from "../parse.ts";
import { withProgress } from "../progress.ts";

interface Options extends CommonOptions {
  olderThan: string;
  state?: JobState[];
}

export function registerPurgeCommand(program: Command): void {
  const command = program
    .command("purge")
    .description("delete finished jobs that finished more than a while ago (keys stay until prune-keys)")
    .requiredOption("--older-than <duration>", "finished more than this long ago, e.g. 7d", parseDuration)
    .option("--state <states>", `only these finished states (default all: ${TERMINAL_STATES.join(", ")})`, parseStates)
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
        await withClient(options, async (client) => {
          const purged = await withProgress(options, `purging jobs finished more than ${options.olderThan} ago`, () =>
            client.purge({ olderThan: options.olderThan, ...(states === null ? {} : { states }) }),
          );
          emit(
            options,
            { purged, olderThan: options.olderThan, states: states ?? [...TERMINAL_STATES] },
            `Purged ${purged} job(s) (${(states ?? TERMINAL_STATES).join(", ")}) finished more than ${options.olderThan} ago; ` +
              "their keys stay until `idemq prune-keys`.",
          );
        });
      }),
    );
  databaseCommand(command, ["idemq purge --older-than 7d", "idemq purge --older-than 1d --state succeeded --json"]);
}
