// idemq prune-keys [--older-than 14d]: releases idempotency keys whose job
// finished more than that long ago and more than the key's own retention
// (enqueue's key_retention: never sooner), and old guard and effect records.
// Without --older-than, prune_keys' own default applies (it lives in SQL only).
import type { Command } from "commander";
import { withClient } from "../connect.ts";
import { type CommonOptions, databaseCommand } from "../define.ts";
import { action, emit } from "../output.ts";
import { parseDuration } from "../parse.ts";
import { withProgress } from "../progress.ts";
import { keyRetentionDefault } from "./doctor.ts";

interface Options extends CommonOptions {
  olderThan?: string;
}

export function registerPruneKeysCommand(program: Command): void {
  const command = program
    .command("prune-keys")
    .description("release idempotency keys whose job finished long ago (a later enqueue with the key makes a new job)")
    .option(
      "--older-than <duration>",
      "finished more than this long ago, and than each key's own retention (default: prune_keys' default, 14 days)",
      parseDuration,
    )
    .action(
      action(async (_options: Options, cmd: Command) => {
        const options = cmd.optsWithGlobals<Options>();
        await withClient(options, async (client) => {
          const olderThan = options.olderThan ?? (await keyRetentionDefault(client.pool));
          const released = await withProgress(options, `releasing keys finished more than ${olderThan} ago`, () =>
            client.pruneKeys(options.olderThan === undefined ? {} : { olderThan: options.olderThan }),
          );
          emit(
            options,
            { prunedKeys: released, olderThan },
            `Released ${released} idempotency key(s) whose job finished more than ${olderThan} ago ` +
              "and past the key's own retention (and guard and effect records older than that).",
          );
        });
      }),
    );
  databaseCommand(command, [
    "idemq prune-keys",
    "idemq prune-keys --older-than 30d --json",
    "",
    "Keep the retention longer than any retry or replay of a keyed enqueue",
    "(idemq doctor checks it against the jobs present).",
  ]);
}
