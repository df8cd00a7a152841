// idemq schedules [list]                       the schedules, by name (and why tick() could not enqueue one)
// idemq schedules add NAME --cron EXPR --task TASK [--payload JSON] [--queue Q] [--timezone TZ]
//   [--overlap P] [--misfire P] [--misfire-grace D] [--priority N] [--max-attempts N]
// idemq schedules remove NAME
// idemq schedules next NAME [--count N]        the next slots of a schedule
// idemq schedules next --cron EXPR [--timezone TZ] [--count N] [--after T]   check an expression, saving nothing
//
// Each is one call of the client (schedule, unschedule, schedules,
// scheduleNext); a value SQL refuses (a bad cron field, an unknown time zone)
// is its one-line error with the HINT, exit 2. A name with no schedule is exit 5.
import { type Command, Option } from "commander";
import {
  SCHEDULE_MISFIRES,
  SCHEDULE_OVERLAPS,
  SCHEDULE_SQL_DEFAULTS,
  type ScheduleMisfire,
  type ScheduleOverlap,
} from "../../contract.ts";
import type { Schedule, ScheduleDefinition } from "../../sql/index.ts";
import { WORKER_DEFAULTS } from "../../worker/defaults.ts";
import { withClient } from "../connect.ts";
import { type CommonOptions, databaseCommand } from "../define.ts";
import { instant, relative, table } from "../format.ts";
import { action, emit, NotFoundError, UsageError } from "../output.ts";
import { integerParser, parseDuration, parseInstant, readPayload } from "../parse.ts";
import { printable } from "../terminal-text.ts";

interface AddOptions extends CommonOptions {
  cron: string;
  task: string;
  payload?: string;
  queue?: string;
  timezone?: string;
  overlap?: ScheduleOverlap;
  misfire?: ScheduleMisfire;
  misfireGrace?: string;
  priority?: number;
  maxAttempts?: number;
}

interface NextOptions extends CommonOptions {
  cron?: string;
  timezone?: string;
  after?: Date;
  count?: number;
}

export function registerSchedulesCommands(program: Command): void {
  const schedules = program
    .command("schedules")
    .description("recurring jobs: list, add (or replace), remove schedules, and show their next slots")
    .addHelpText(
      "after",
      `
Examples:
  idemq schedules                                   # list them (same as schedules list)
  idemq schedules add nightly-report --cron "0 3 * * *" --timezone Europe/Berlin --task report
  idemq schedules next --cron "*/15 9-17 * * MON-FRI" --count 5
  idemq schedules remove nightly-report

Workers tick every ${WORKER_DEFAULTS.tickInterval} by default (tickInterval): each slot gets one job, however many run.`,
    );

  const list = schedules
    .command("list", { isDefault: true })
    .description("list the schedules, by name, with each one's next slot and latest job, and why tick() could not enqueue one")
    .action(
      action(async (_options: CommonOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<CommonOptions>();
        await withClient(options, async (client) => {
          const found = await client.schedules();
          emit(options, found, found.length === 0 ? "No schedules. Add one with `idemq schedules add`." : renderList(found));
        });
      }),
    );
  databaseCommand(list, ["idemq schedules list", "idemq schedules --json | jq '.[].nextAt'"]);

  const add = schedules
    .command("add")
    .description("create the schedule NAME, or replace its definition (a schedule whose cron and time zone stay keeps its next slot)")
    .argument("<name>", "the schedule's name (part of each slot's idempotency key)")
    .requiredOption("--cron <expression>", 'when: 5 fields (minute hour day month weekday), 6 with seconds first, @daily..., or "@every 30s"')
    .requiredOption("--task <task>", "the task each slot enqueues")
    .option("--payload <json>", "the jobs' payload: JSON text, @file.json, or - for stdin (default {})")
    .option("--queue <queue>", "queue of the jobs (default: enqueue's)")
    .option("--timezone <zone>", `IANA time zone the cron is read in (default ${SCHEDULE_SQL_DEFAULTS.timezone})`)
    .addOption(
      new Option("--overlap <policy>", `while the latest job is active (default ${SCHEDULE_SQL_DEFAULTS.overlap})`).choices(
        SCHEDULE_OVERLAPS,
      ),
    )
    .addOption(
      new Option("--misfire <policy>", `slots missed while nothing ticked (default ${SCHEDULE_SQL_DEFAULTS.misfire})`).choices(
        SCHEDULE_MISFIRES,
      ),
    )
    .addOption(
      new Option("--misfire-grace <duration>", `how late a slot still counts as on time (default ${SCHEDULE_SQL_DEFAULTS.misfireGrace})`).argParser(
        parseDuration,
      ),
    )
    .option("--priority <n>", "priority of the jobs (higher runs first)", integerParser("--priority", -2_147_483_648))
    .option("--max-attempts <n>", "attempts of each job", integerParser("--max-attempts", 1))
    .action(
      action(async (name: string, _options: AddOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<AddOptions>();
        const payload = await readPayload(options.payload);
        const definition: ScheduleDefinition = {
          name,
          cron: options.cron,
          task: options.task,
          ...(payload === undefined ? {} : { payload }),
          ...(options.queue === undefined ? {} : { queue: options.queue }),
          ...(options.timezone === undefined ? {} : { timezone: options.timezone }),
          ...(options.overlap === undefined ? {} : { overlap: options.overlap }),
          ...(options.misfire === undefined ? {} : { misfire: options.misfire }),
          ...(options.misfireGrace === undefined ? {} : { misfireGrace: options.misfireGrace }),
          ...(options.priority === undefined ? {} : { priority: options.priority }),
          ...(options.maxAttempts === undefined ? {} : { maxAttempts: options.maxAttempts }),
        };
        await withClient(options, async (client) => {
          const before = (await client.schedules()).find((s) => s.name === name);
          await client.schedule(definition);
          const saved = (await client.schedules()).find((s) => s.name === name)!;
          // schedule() writes nothing for the definition already stored: its updated_at stays.
          const outcome =
            before === undefined ? "added" : before.updatedAt.getTime() === saved.updatedAt.getTime() ? "unchanged" : "replaced";
          emit(options, { outcome, schedule: saved }, `${outcome} ${scheduleLine(saved)}`);
        });
      }),
    );
  databaseCommand(add, [
    `idemq schedules add nightly-report --cron "0 3 * * *" --timezone Europe/Berlin --task report --payload '{"kind": "daily"}'`,
    `idemq schedules add heartbeat --cron "@every 30s" --task ping --overlap allow`,
    `idemq schedules add sync --cron "*/5 * * * *" --task sync --misfire skip --json`,
    "",
    `Overlap: ${SCHEDULE_OVERLAPS.join(", ")}. Misfire: ${SCHEDULE_MISFIRES.join(", ")}.`,
    "A bad cron or time zone is one line naming the field, exit 2; nothing is saved.",
    "Check an expression first with `idemq schedules next --cron EXPR`.",
  ]);

  const remove = schedules
    .command("remove")
    .description("remove the schedule NAME (jobs it already enqueued stay)")
    .argument("<name>", "the schedule's name")
    .action(
      action(async (name: string, _options: CommonOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<CommonOptions>();
        await withClient(options, async (client) => {
          const removed = await client.unschedule(name);
          if (!removed) return noSuchSchedule(name, "nothing removed");
          emit(options, { name, removed }, `removed schedule ${printable(name)}`);
        });
      }),
    );
  databaseCommand(remove, ["idemq schedules remove nightly-report", "", "Exit codes: 0 removed, 5 no schedule of that name."]);

  const next = schedules
    .command("next")
    .description("the next slots of the schedule NAME, or of --cron EXPR (checked, nothing saved)")
    .argument("[name]", "a schedule's name (or give --cron)")
    .option("--cron <expression>", "an expression to check instead of a saved schedule")
    .option("--timezone <zone>", `with --cron: the IANA time zone (default ${SCHEDULE_SQL_DEFAULTS.timezone})`)
    .addOption(new Option("--after <time>", "with --cron: slots after this time (ISO 8601; default now)").argParser(parseInstant))
    .option("--count <n>", "how many slots (default 1)", integerParser("--count", 1, 1000))
    .action(
      action(async (name: string | undefined, _options: NextOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<NextOptions>();
        if ((name === undefined) === (options.cron === undefined)) {
          throw new UsageError("give a schedule's name or --cron EXPR, e.g. `idemq schedules next nightly-report --count 5`");
        }
        if (name !== undefined && (options.timezone !== undefined || options.after !== undefined)) {
          throw new UsageError("--timezone and --after go with --cron; a saved schedule has its own time zone");
        }
        await withClient(options, async (client) => {
          let timezone: string;
          let cron: string;
          let slots: Date[];
          if (name !== undefined) {
            const found = (await client.schedules()).find((s) => s.name === name);
            const got = found === undefined ? null : await client.scheduleNext(name, { count: options.count });
            if (found === undefined || got === null) return noSuchSchedule(name, "no slots to show");
            ({ cron, timezone } = found);
            slots = got;
          } else {
            cron = options.cron!;
            timezone = options.timezone ?? SCHEDULE_SQL_DEFAULTS.timezone;
            slots = await client.scheduleNext({ cron, timezone: options.timezone, after: options.after, count: options.count });
          }
          const now = Date.now();
          emit(
            options,
            { ...(name === undefined ? {} : { name }), cron, timezone, slots },
            slots.length === 0
              ? "No slot within 50 years."
              : slots.map((at) => `${instant(at)}  ${localTime(at, timezone)}  ${relative(at, now)}`.replace(/ {2}$/, "")),
          );
        });
      }),
    );
  databaseCommand(next, [
    "idemq schedules next nightly-report --count 5",
    `idemq schedules next --cron "30 2 * * *" --timezone Europe/Berlin --count 3`,
    `idemq schedules next --cron "0 9 * * MON-FRI" --after 2026-12-24T00:00:00Z --count 5 --json`,
    "",
    "Exit codes: 0 shown, 2 a bad expression, time zone or count, 5 no schedule of that name.",
  ]);
}

/** Exit 5 (NotFoundError): scripts tell a missing schedule from a failure. */
function noSuchSchedule(name: string, consequence: string): never {
  throw new NotFoundError(`no schedule named ${JSON.stringify(name)}; ${consequence} (\`idemq schedules list\` shows them)`);
}

const LIST_COLUMNS = ["NAME", "CRON", "TIMEZONE", "TASK", "QUEUE", "NEXT", "LAST JOB", "SKIPPED"] as const;

function renderList(found: readonly Schedule[], now = Date.now()): string[] {
  const lines = table(
    LIST_COLUMNS,
    found.map((s) => [
      s.name,
      s.cron,
      s.timezone,
      s.task,
      s.queue,
      `${instant(s.nextAt)} (${relative(s.nextAt, now)})`,
      s.lastJobId === null ? "-" : `${s.lastJobId} ${s.lastJobState ?? "purged"}`,
      String(s.skipped),
    ]),
    [7],
  );
  // A schedule tick() could not enqueue: it stays due, and says why under the table.
  for (const s of found) {
    if (s.lastError === null) continue;
    lines.push(
      `! ${printable(s.name)}: tick() could not enqueue its job at ${instant(s.lastErrorAt!)} (${relative(s.lastErrorAt!, now)}): ${printable(s.lastError)}`,
    );
  }
  return lines;
}

/** "nightly (task report, queue default): cron "0 3 * * *" in Europe/Berlin, next 2026-12-02T02:00:00Z (in 5h)". */
function scheduleLine(s: Schedule): string {
  return (
    `schedule ${printable(s.name)} (task ${printable(s.task)}, queue ${printable(s.queue)}): ` +
    `cron ${printable(JSON.stringify(s.cron))} in ${printable(s.timezone)}, overlap ${s.overlap}, misfire ${s.misfire}, ` +
    `next ${instant(s.nextAt)} (${relative(s.nextAt)})`
  );
}

/** The slot's wall-clock time in the schedule's zone ("2026-12-02 03:00:00 Europe/Berlin"); empty for UTC, or a zone this Node lacks. */
function localTime(at: Date, timezone: string): string {
  if (timezone === "UTC") return "";
  try {
    // sv-SE writes YYYY-MM-DD HH:MM:SS.
    return `${new Intl.DateTimeFormat("sv-SE", { timeZone: timezone, dateStyle: "short", timeStyle: "medium" }).format(at)} ${printable(timezone)}`;
  } catch {
    return "";
  }
}
