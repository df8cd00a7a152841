// idemq limit [list]                               every queue and task with a limit or a pause, and its use now
// idemq limit set --queue Q|--task T [--concurrency N] [--rate R --per D] [--per-key K]
// idemq limit clear --queue Q|--task T             remove its limits (a pause stays)
// idemq limit keys                                 the concurrency keys held back now (RateLimitedError scope "key")
// idemq pause --queue Q|--task T                   claims hand out none of its jobs until resume
// idemq resume --queue Q|--task T
//
// Each is one call of the client (setLimit, clearLimit, limits, heldKeys,
// pause, resume). The scope (exactly one of --queue and --task) and rate with per
// are checked before the database is opened; a value SQL refuses (a limit out
// of range, per under a second) is its one-line error with the HINT, exit 2,
// nothing written. clear of a scope with no limit is exit 5, like
// `schedules remove` of no schedule.
import { type Command, Option } from "commander";
import type { Client } from "../../client.ts";
import type { HeldKeyRow, LimitRow, LimitScope } from "../../sql/index.ts";
import { withClient } from "../connect.ts";
import { type CommonOptions, databaseCommand } from "../define.ts";
import { table } from "../format.ts";
import { action, emit, NotFoundError, UsageError } from "../output.ts";
import { integerParser, parseDuration } from "../parse.ts";
import { printable } from "../terminal-text.ts";

interface ScopeOptions extends CommonOptions {
  queue?: string;
  task?: string;
}

interface SetOptions extends ScopeOptions {
  concurrency?: number;
  rate?: number;
  per?: string;
  perKey?: number;
}

const SCOPE_EXAMPLE = "e.g. --queue emails or --task send-email";

export function registerLimitCommands(program: Command): void {
  const limit = program
    .command("limit")
    .description("flow control obeyed by every claim (workers and SQL consumers): concurrency, rate, per-key limits")
    .addHelpText(
      "after",
      `
Examples:
  idemq limit                                        # list them (same as limit list)
  idemq limit set --queue emails --concurrency 5 --rate 100 --per 1m
  idemq limit clear --queue emails
  idemq pause --task send-email                      # and idemq resume --task send-email

A job obeys its queue's limits and its task's.`,
    );

  const list = limit
    .command("list", { isDefault: true })
    .description("every queue and task with a limit, a pause or a hold: its limits, paused, held until, slots held, starts in the rate's window")
    .action(
      action(async (_options: CommonOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<CommonOptions>();
        await withClient(options, async (client) => {
          const rows = await client.limits();
          emit(options, rows, rows.length === 0 ? "No limits, pauses or holds. Set one with `idemq limit set`." : renderLimits(rows));
        });
      }),
    );
  databaseCommand(list, [
    "idemq limit list",
    "idemq limit --json | jq '.[] | select(.paused)'",
    "",
    "RUNNING is the slots held (of CONCURRENCY); STARTED the starts within the last PER (of RATE);",
    "HELD UNTIL the end of a hold (a handler's RateLimitedError, idemq.hold) still to come.",
  ]);

  const keys = limit
    .command("keys")
    .description("the concurrency keys held back now (a handler's RateLimitedError with scope \"key\", idemq.hold), and until when")
    .action(
      action(async (_options: CommonOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<CommonOptions>();
        await withClient(options, async (client) => {
          const rows = await client.heldKeys();
          emit(options, rows, rows.length === 0 ? "No concurrency key is held." : renderHeldKeys(rows));
        });
      }),
    );
  databaseCommand(keys, [
    "idemq limit keys",
    "idemq limit keys --json | jq -r '.[].concurrencyKey'",
    "",
    "No job of a key listed starts before its HELD UNTIL; its jobs processing then run on.",
  ]);

  const set = scopeOptions(
    limit
      .command("set")
      .description("set the limits of one queue or task; options left out keep their value (clear removes them all)")
      .option("--concurrency <n>", "at most N of its jobs processing at once, across all workers and SQL consumers", integerParser("--concurrency", 1))
      .option("--rate <n>", "at most N starts (claims, retries included) per --per", integerParser("--rate", 1))
      .addOption(new Option("--per <duration>", "the period of --rate, at least 1s (e.g. 1s, 1m, 1h)").argParser(parseDuration))
      .option("--per-key <n>", "at most N jobs of one concurrency key admitted at once (default 1)", integerParser("--per-key", 1)),
  ).action(
    action(async (_options: SetOptions, cmd: Command) => {
      const options = cmd.optsWithGlobals<SetOptions>();
      const scope = scopeOf(options, "limit set");
      if ((options.rate === undefined) !== (options.per === undefined)) {
        throw new UsageError(
          `--rate and --per go together (got ${options.rate === undefined ? "--per without --rate" : "--rate without --per"}), e.g. --rate 100 --per 1m`,
        );
      }
      if ([options.concurrency, options.rate, options.perKey].every((v) => v === undefined)) {
        throw new UsageError("give at least one limit: --concurrency N, --rate N --per D or --per-key N (`idemq limit clear` removes them)");
      }
      await withClient(options, async (client) => {
        await client.setLimit({
          ...scope,
          concurrency: options.concurrency,
          rate: options.rate,
          per: options.per,
          perKey: options.perKey,
        });
        const row = (await findLimit(client, scope))!;
        emit(options, row, `set ${scopeText(scope)}: ${limitsText(row)}`);
      });
    }),
  );
  databaseCommand(set, [
    "idemq limit set --queue emails --concurrency 5",
    "idemq limit set --task charge-card --rate 100 --per 1m --json",
    "idemq limit set --queue partner-api --concurrency 10 --rate 20 --per 1s",
    "",
    "Exactly one of --queue and --task. A limit out of range or --per under 1s is one line, exit 2; nothing is written.",
  ]);

  const clear = scopeOptions(
    limit.command("clear").description("remove every limit of one queue or task (a pause stays: `idemq resume` ends it)"),
  ).action(
    action(async (_options: ScopeOptions, cmd: Command) => {
      const options = cmd.optsWithGlobals<ScopeOptions>();
      const scope = scopeOf(options, "limit clear");
      await withClient(options, async (client) => {
        const cleared = await client.clearLimit(scope);
        if (!cleared) {
          throw new NotFoundError(`${scopeText(scope)} has no limit; nothing cleared (\`idemq limit list\` shows them)`);
        }
        emit(options, { ...scopeJson(scope), cleared }, `cleared the limits of ${scopeText(scope)}`);
      });
    }),
  );
  databaseCommand(clear, ["idemq limit clear --queue emails", "idemq limit clear --task charge-card --json", "", "Exit codes: 0 cleared, 5 it had no limit."]);

  for (const verb of ["pause", "resume"] as const) {
    const command = scopeOptions(
      program
        .command(verb)
        .description(
          verb === "pause"
            ? "pause one queue or task: claims hand out none of its jobs until resume; running jobs finish, enqueue works"
            : "end the pause of one queue or task: claims take its jobs again",
        ),
    ).action(
      action(async (_options: ScopeOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<ScopeOptions>();
        const scope = scopeOf(options, verb);
        await withClient(options, async (client) => {
          const changed = verb === "pause" ? await client.pause(scope) : await client.resume(scope);
          const paused = verb === "pause";
          emit(
            options,
            { ...scopeJson(scope), paused, changed },
            changed
              ? `${paused ? "paused" : "resumed"} ${scopeText(scope)}`
              : `${scopeText(scope)} was ${paused ? "already paused" : "not paused"}; nothing changed`,
          );
        });
      }),
    );
    databaseCommand(
      command,
      verb === "pause"
        ? ["idemq pause --queue emails", "idemq pause --task charge-card --json", "", "The pause survives restarts; `idemq limit list` shows it."]
        : ["idemq resume --queue emails", "idemq resume --task charge-card --json"],
    );
  }
}

function scopeOptions(command: Command): Command {
  return command.option("--queue <queue>", "the queue (give this or --task)").option("--task <task>", "the task (give this or --queue)");
}

/** Exactly one of --queue and --task, checked before the database is opened. */
function scopeOf(options: ScopeOptions, what: string): LimitScope {
  if ((options.queue === undefined) === (options.task === undefined)) {
    throw new UsageError(
      `${what}: give exactly one of --queue and --task, not ${options.queue === undefined ? "neither" : "both"} (${SCOPE_EXAMPLE})`,
    );
  }
  return options.queue !== undefined ? { queue: options.queue } : { task: options.task };
}

function scopeJson(scope: LimitScope): { queue: string | null; task: string | null } {
  return { queue: scope.queue ?? null, task: scope.task ?? null };
}

function scopeText(scope: { queue?: string | null | undefined; task?: string | null | undefined }): string {
  return scope.queue !== undefined && scope.queue !== null ? `queue ${printable(scope.queue)}` : `task ${printable(scope.task ?? "")}`;
}

async function findLimit(client: Client, scope: LimitScope): Promise<LimitRow | undefined> {
  return (await client.limits()).find((r) => (scope.queue !== undefined ? r.queue === scope.queue : r.task === scope.task));
}

/** "concurrency 5, rate 100 per 1m, per key 1" (or "none" for a paused scope without limits). */
export function limitsText(row: LimitRow): string {
  const parts: string[] = [];
  if (row.concurrency !== null) parts.push(`concurrency ${row.concurrency}`);
  if (row.rate !== null) parts.push(`rate ${row.rate} per ${periodText(row.per)}`);
  if (row.perKey !== null) parts.push(`per key ${row.perKey}`);
  return parts.length === 0 ? "none" : parts.join(", ");
}

/** PostgreSQL's interval text ("00:01:00", "1 day 02:00:00") as the CLI writes durations ("1m", "1d2h"). */
export function periodText(per: string | null): string {
  if (per === null) return "-";
  const match = /^(?:(\d+) days? ?)?(?:(\d+):(\d+):(\d+(?:\.\d+)?))?$/.exec(per);
  if (match === null) return per;
  const [, days, h, m, s] = match;
  const parts: string[] = [];
  if (days !== undefined && Number(days) !== 0) parts.push(`${Number(days)}d`);
  if (h !== undefined && Number(h) !== 0) parts.push(`${Number(h)}h`);
  if (m !== undefined && Number(m) !== 0) parts.push(`${Number(m)}m`);
  if (s !== undefined && Number(s) !== 0) parts.push(`${Number(s)}s`);
  return parts.length === 0 ? "0s" : parts.join("");
}

const LIST_COLUMNS = ["SCOPE", "LIMITS", "PAUSED", "HELD UNTIL", "RUNNING", "STARTED"] as const;

export function renderHeldKeys(rows: readonly HeldKeyRow[]): string[] {
  return table(["CONCURRENCY KEY", "HELD UNTIL"], rows.map((r) => [r.concurrencyKey, r.heldUntil.toISOString()]));
}

/** The limits as `idemq limit list` and `idemq stats` show them: one row per scope. */
export function renderLimits(rows: readonly LimitRow[]): string[] {
  return table(
    LIST_COLUMNS,
    rows.map((r) => [
      scopeText(r),
      limitsText(r),
      r.paused ? "yes" : "no",
      r.heldUntil === null ? "-" : r.heldUntil.toISOString(),
      r.running === null ? "-" : `${r.running}/${r.concurrency}`,
      r.started === null ? "-" : `${r.started}/${r.rate} in ${periodText(r.per)}`,
    ]),
  );
}
