// idemq rescue: jobs whose lease expired (a crashed worker) back to enqueued,
// or failed on their last attempt; jobs past their deadline expired. Workers
// do this on a timer; this is the same idempotent call, once.
import type { Command } from "commander";
import { withClient } from "../connect.ts";
import { type CommonOptions, databaseCommand } from "../define.ts";
import { action, emit } from "../output.ts";
import { withProgress } from "../progress.ts";

export function registerRescueCommand(program: Command): void {
  const command = program
    .command("rescue")
    .description("take back jobs whose lease expired (crashed workers) and expire jobs past their deadline")
    .action(
      action(async (_options: CommonOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<CommonOptions>();
        await withClient(options, async (client) => {
          const rescued = await withProgress(options, "rescuing jobs with expired leases", () => client.rescue());
          emit(
            options,
            { rescued },
            rescued === 0
              ? "Nothing to rescue: no expired lease, no job past its deadline."
              : `Rescued ${rescued} job(s): expired leases back to enqueued (or failed on their last attempt), jobs past their deadline expired.`,
          );
        });
      }),
    );
  databaseCommand(command, ["idemq rescue", "idemq rescue --json   # {\"rescued\": 3}"]);
}
