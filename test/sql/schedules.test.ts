// Schedules, the definition side: cron parsing and next-fire times against
// expressions with known answers (steps, names, the day-of-month/day-of-week
// rule, Feb 29, @macros, DST in Europe/Berlin and America/New_York), the
// validation of schedule() (22023 naming the bad field, with a HINT, and
// nothing written), and the upsert, read and removal of a schedule.
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase, inRollback } from "../helpers/db.ts";
import { count, sql, unique } from "../helpers/jobs.ts";
import { nextSlots, schedule, scheduleRow, setNextAt } from "../helpers/schedules.ts";

const db = useTestDatabase({ poolSize: 4 });

const z = (s: string) => new Date(s).toISOString();

describe("schedule_next: known answers", () => {
  // [what, cron, timezone, after, expected slots (UTC)]
  const cases: Array<[string, string, string, string, string[]]> = [
    ["*/7 minutes: 0,7,...,56, then the next hour", "*/7 * * * *", "UTC", "2026-01-01T00:50:00Z",
      ["2026-01-01T00:56:00Z", "2026-01-01T01:00:00Z", "2026-01-01T01:07:00Z"]],
    ["a range with a step: 1-10/2 is 1,3,5,7,9", "1-10/2 * * * *", "UTC", "2026-01-01T00:09:00Z",
      ["2026-01-01T01:01:00Z", "2026-01-01T01:03:00Z"]],
    ["a value with a step runs to the end: 50/5 is 50,55", "50/5 * * * *", "UTC", "2026-01-01T00:00:00Z",
      ["2026-01-01T00:50:00Z", "2026-01-01T00:55:00Z", "2026-01-01T01:50:00Z"]],
    ["lists", "0,30 8,17 * * *", "UTC", "2026-01-01T08:00:00Z",
      ["2026-01-01T08:30:00Z", "2026-01-01T17:00:00Z", "2026-01-01T17:30:00Z", "2026-01-02T08:00:00Z"]],
    ["month and weekday names (day of month *: Sundays of January and March)", "0 12 * JAN,MAR SUN", "UTC", "2026-01-01T00:00:00Z",
      ["2026-01-04T12:00:00Z", "2026-01-11T12:00:00Z", "2026-01-18T12:00:00Z", "2026-01-25T12:00:00Z", "2026-03-01T12:00:00Z"]],
    ["weekday 7 is Sunday", "0 0 * * 7", "UTC", "2026-01-01T00:00:00Z", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]],
    ["lower-case names and a weekday range", "30 9 * * mon-fri", "UTC", "2026-01-02T10:00:00Z",
      ["2026-01-05T09:30:00Z", "2026-01-06T09:30:00Z"]],
    ["both day fields restricted: either matches (13th OR Friday)", "0 0 13 * FRI", "UTC", "2026-01-01T00:00:00Z",
      ["2026-01-02T00:00:00Z", "2026-01-09T00:00:00Z", "2026-01-13T00:00:00Z", "2026-01-16T00:00:00Z"]],
    ["a day-of-month starting with * is not restricted: both must match (odd days that are Mondays)", "0 0 */2 * MON", "UTC",
      "2026-01-01T00:00:00Z", ["2026-01-05T00:00:00Z", "2026-01-19T00:00:00Z", "2026-02-09T00:00:00Z", "2026-02-23T00:00:00Z"]],
    ["Feb 29 fires in leap years only", "0 0 29 2 *", "UTC", "2026-03-01T00:00:00Z", ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"]],
    ["day 31 skips the months without one", "0 0 31 * *", "UTC", "2026-01-31T00:00:00Z",
      ["2026-03-31T00:00:00Z", "2026-05-31T00:00:00Z", "2026-07-31T00:00:00Z"]],
    ["a sixth field: seconds first", "*/15 * * * * *", "UTC", "2026-01-01T00:00:50Z",
      ["2026-01-01T00:01:00Z", "2026-01-01T00:01:15Z"]],
    ["after a fraction of a second, the same second's slot is not repeated", "* * * * * *", "UTC", "2026-01-01T00:00:00.5Z",
      ["2026-01-01T00:00:01Z"]],
    ["@every: multiples of the period since the epoch", "@every 10 minutes", "Europe/Berlin", "2026-01-01T00:05:00Z",
      ["2026-01-01T00:10:00Z", "2026-01-01T00:20:00Z"]],
    ["@every 90 seconds", "@every 90 seconds", "UTC", "2026-01-01T00:00:00Z", ["2026-01-01T00:01:30Z", "2026-01-01T00:03:00Z"]],
    ["@hourly", "@hourly", "UTC", "2026-01-01T00:00:00Z", ["2026-01-01T01:00:00Z"]],
    ["@daily", "@daily", "UTC", "2026-01-01T00:00:00Z", ["2026-01-02T00:00:00Z"]],
    ["@weekly is Sunday midnight", "@weekly", "UTC", "2026-01-01T00:00:00Z", ["2026-01-04T00:00:00Z"]],
    ["@monthly", "@monthly", "UTC", "2026-01-01T00:00:00Z", ["2026-02-01T00:00:00Z"]],
    ["@yearly", "@yearly", "UTC", "2026-01-01T00:00:00Z", ["2027-01-01T00:00:00Z"]],
    ["a half-hour offset zone (Asia/Kolkata, +05:30)", "0 9 * * *", "Asia/Kolkata", "2026-01-01T00:00:00Z", ["2026-01-01T03:30:00Z"]],
    // Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST (01:00Z); 2026-10-25 03:00 CEST -> 02:00 CET (01:00Z).
    ["Berlin spring forward: 02:30 does not exist and runs once at the change (03:00 CEST)", "30 2 * * *", "Europe/Berlin",
      "2026-03-28T12:00:00Z", ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z", "2026-03-31T00:30:00Z"]],
    ["Berlin spring forward: the skipped 02:00-02:45 and 03:00 are one run", "*/15 * * * *", "Europe/Berlin",
      "2026-03-29T00:30:00Z", ["2026-03-29T00:45:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:15:00Z", "2026-03-29T01:30:00Z"]],
    ["Berlin fall back: 02:30 occurs twice and runs once, at its first occurrence (CEST)", "30 2 * * *", "Europe/Berlin",
      "2026-10-24T12:00:00Z", ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]],
    ["Berlin fall back: hourly skips the repeated 02:00", "0 * * * *", "Europe/Berlin", "2026-10-24T23:30:00Z",
      ["2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z", "2026-10-25T03:00:00Z"]],
    // America/New_York: 2026-03-08 02:00 EST -> 03:00 EDT (07:00Z); 2026-11-01 02:00 EDT -> 01:00 EST (06:00Z).
    ["New York spring forward: 02:30 runs once at 03:00 EDT", "30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z",
      ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]],
    ["New York fall back: 01:30 runs once (EDT), the next day at 01:30 EST", "30 1 * * *", "America/New_York",
      "2026-10-31T12:00:00Z", ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]],
    ["New York fall back: every 30 minutes skips the repeated hour", "*/30 * * * *", "America/New_York", "2026-11-01T04:45:00Z",
      ["2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z"]],
    ["New York fall back: from inside the repeated hour, its slots already ran", "*/30 * * * *", "America/New_York",
      "2026-11-01T06:10:00Z", ["2026-11-01T07:00:00Z"]],
  ];
  it.each(cases)("%s", async (_what, cron, timezone, after, expected) => {
    expect(await nextSlots(db.pool, cron, timezone, after, expected.length)).toEqual(expected.map(z));
  });

  it("a slot exactly at `after` is not returned (strictly after)", async () => {
    expect(await nextSlots(db.pool, "0 * * * *", "UTC", "2026-01-01T05:00:00Z", 1)).toEqual([z("2026-01-01T06:00:00Z")]);
    expect(await nextSlots(db.pool, "0 * * * *", "UTC", "2026-01-01T04:59:59.999999Z", 1)).toEqual([z("2026-01-01T05:00:00Z")]);
  });

  it("rare and dense expressions come without a scan over time: Feb 29 across non-leap years, 1000 slots of a seconds schedule", async () => {
    const started = Date.now();
    expect(await nextSlots(db.pool, "0 0 29 2 *", "UTC", "2029-01-01T00:00:00Z", 3)).toEqual(
      ["2032-02-29T00:00:00Z", "2036-02-29T00:00:00Z", "2040-02-29T00:00:00Z"].map(z),
    );
    const many = await nextSlots(db.pool, "* * * * * *", "UTC", "2026-01-01T00:00:00Z", 1000);
    expect(many).toHaveLength(1000);
    expect(many.at(-1)).toBe(z("2026-01-01T00:16:40Z"));
    // Generous on a loaded machine; a minute-by-minute scan over years would take far longer.
    expect(Date.now() - started).toBeLessThan(20_000);
  });
});

describe("schedule: validation (22023 naming the bad field, with a HINT; nothing written)", () => {
  const badCron: Array<[string, RegExp]> = [
    ["0 25 * * *", /cron field 2 \(hour\) "25" is out of range 0-23/],
    ["60 * * * *", /cron field 1 \(minute\) "60" is out of range 0-59/],
    ["0 0 32 * *", /cron field 3 \(day of month\) "32" is out of range 1-31/],
    ["0 0 0 * *", /cron field 3 \(day of month\) "0" is out of range 1-31/],
    ["0 0 * 13 *", /cron field 4 \(month\) "13" is out of range 1-12/],
    ["0 0 * * 8", /cron field 5 \(day of week\) "8" is out of range 0-7/],
    ["61 * * * * *", /cron field 1 \(second\) "61" is out of range 0-59/],
    ["0 0 24 * * *", /cron field 3 \(hour\) "24" is out of range 0-23/],
    ["0 0 * FOO *", /cron field 4 \(month\) "FOO" is not a number or a name/],
    ["x * * * *", /cron field 1 \(minute\) "x" is not a number$/],
    ["*/0 * * * *", /cron field 1 \(minute\) step "0" is not a whole number of at least 1/],
    ["5-1 * * * *", /cron field 1 \(minute\) range "5-1" starts after it ends/],
    ["1,,2 * * * *", /cron field 1 \(minute\) "" is not a value, range or step/],
    ["1-2-3 * * * *", /cron field 1 \(minute\) "1-2-3" is not a value, range or step/],
    ["* * * *", /cron "\* \* \* \*" has 4 fields, not 5 or 6/],
    ["", /cron "" has 0 fields, not 5 or 6/],
    ["@often", /cron "@often" is not a known macro/],
    ["@every soon", /"soon" is not an interval/],
    ["@every 1 month", /the period must be a whole number of seconds/],
    ["@every 1.5 seconds", /the period must be a whole number of seconds/],
    ["0 0 31 2 *", /cron "0 0 31 2 \*" never fires/],
  ];
  it.each(badCron)("cron %j", async (cron, message) => {
    const name = unique("bad");
    await expectSqlError(schedule(db.pool, { name, cron }), { code: "22023", message, hint: /\S/ });
    expect(await count(db.pool, "SELECT 1 FROM idemq.schedules WHERE name = $1", [name])).toBe(0);
  });

  it("schedule_next validates the same way, with the same message", async () => {
    await expectSqlError(nextSlots(db.pool, "0 25 * * *", "UTC", "2026-01-01T00:00:00Z", 1), {
      code: "22023",
      message: 'cron field 2 (hour) "25" is out of range 0-23',
      hint: /Field 2 \(hour\) takes 0-23/,
    });
    await expectSqlError(nextSlots(db.pool, "* * * * *", "UTC", "2026-01-01T00:00:00Z", 0), { code: "22023", message: /count/ });
    await expectSqlError(nextSlots(db.pool, "* * * * *", "Nowhere/Town", "2026-01-01T00:00:00Z", 1), {
      code: "22023",
      message: /schedule_next: timezone "Nowhere\/Town"/,
    });
  });

  const badArgs: Array<[string, Parameters<typeof schedule>[1], string, RegExp]> = [
    ["an unknown time zone", { timezone: "Mars/Olympus" }, "22023", /timezone "Mars\/Olympus" is not an IANA time zone name/],
    ["an abbreviation for a time zone", { timezone: "CEST" }, "22023", /timezone "CEST"/],
    ["a POSIX offset for a time zone", { timezone: "UTC+3" }, "22023", /timezone "UTC\+3"/],
    ["an empty name", { name: "" }, "22023", /name must not be empty/],
    ["a name over 200 characters", { name: "n".repeat(201) }, "22023", /at most 200 characters/],
    ["an empty task", { task: "" }, "22023", /task must not be empty/],
    ["a payload that is not an object", { payload: [1] }, "22023", /payload must be a JSON object/],
    ["an empty queue", { queue: "" }, "22023", /queue must be 1 to 1000 characters/],
    ["max_attempts 0", { max_attempts: 0 }, "22023", /max_attempts must be at least 1/],
    ["misfire_grace under a second", { misfire_grace: "0.5 seconds" }, "22023", /misfire_grace must be between 1 second and 1 day/],
    ["misfire_grace over a day", { misfire_grace: "25 hours" }, "22023", /misfire_grace/],
    // The job a slot enqueues meets enqueue's limits (_job_problem), so tick() never meets a refused one.
    ["a task over task_bytes", { task: "t".repeat(257) }, "22023", /its jobs would be refused: task is 257 bytes, over the limit of 256 bytes/],
    ["a payload over payload_bytes", { payload: { s: "x".repeat(1_048_576) } }, "22023", /its jobs would be refused: payload is 1048585 bytes/],
  ];
  it.each(badArgs)("%s", async (_what, args, code, message) => {
    const name = args.name ?? unique("bad");
    await expectSqlError(schedule(db.pool, { name, cron: "* * * * *", ...args }), { code, message, hint: /\S/ });
    expect(await count(db.pool, "SELECT 1 FROM idemq.schedules WHERE name = $1", [name])).toBe(0);
  });

  it.each(["name", "cron", "task", "timezone", "overlap", "misfire", "misfire_grace"])("NULL %s: 22004 naming it", async (arg) => {
    const name = unique("null");
    await expectSqlError(schedule(db.pool, { name, cron: "* * * * *", [arg]: sql("NULL") }), {
      code: "22004",
      message: new RegExp(`${arg} must not be NULL`),
      hint: /\S/,
    });
    expect(await count(db.pool, "SELECT 1 FROM idemq.schedules WHERE name = $1", [name])).toBe(0);
  });

  it("an unknown policy is refused by its enum (22P02)", async () => {
    await expectSqlError(schedule(db.pool, { name: unique("p"), cron: "* * * * *", overlap: "never" as "skip" }), { code: "22P02" });
  });

  it("a name whose slot key (schedule:<name>:<slot>) would be over key_bytes is refused; one byte less is scheduled", async () => {
    // '€' is 3 bytes: schedule: (9) + 160 x 3 + : (1) + the 20-character slot = 510 bytes; 161 of them, 513.
    await schedule(db.pool, { name: "€".repeat(160), cron: "* * * * *" });
    const name = "€".repeat(161);
    await expectSqlError(schedule(db.pool, { name, cron: "* * * * *" }), {
      code: "22023",
      message: /its jobs would be refused: idempotency_key is 513 bytes, over the limit of 512 bytes \(key_bytes\)/,
      hint: /key_bytes/,
    });
    expect(await count(db.pool, "SELECT 1 FROM idemq.schedules WHERE name = $1", [name])).toBe(0);
  });

  it("a bad redefinition leaves the existing schedule as it was", async () => {
    const name = unique("keep");
    await schedule(db.pool, { name, cron: "0 3 * * *", task: "nightly" });
    const before = await scheduleRow(db.pool, name);
    await expectSqlError(schedule(db.pool, { name, cron: "0 3 * * * * *", task: "other" }), { code: "22023", message: /7 fields/ });
    expect(await scheduleRow(db.pool, name)).toEqual(before);
  });
});

describe("schedule, schedules, unschedule", () => {
  it("creates a schedule with enqueue()'s defaults, returns its next slot, and lists it", async () => {
    await inRollback(db.pool, async (c) => {
      const name = unique("daily");
      const next = await schedule(c, { name, cron: "0 3 * * *", timezone: "Europe/Berlin" });
      const { rows } = await c.query<{ expected: Date }>(
        "SELECT s AS expected FROM idemq.schedule_next(cron => '0 3 * * *', timezone => 'Europe/Berlin', after => now()) s",
      );
      expect(next).toEqual(rows[0]!.expected);
      expect(await scheduleRow(c, name)).toMatchObject({
        name, cron: "0 3 * * *", timezone: "Europe/Berlin", task: "report", queue: "default", payload: {},
        priority: 0, max_attempts: 10, overlap: "skip", misfire: "once", misfire_grace: "00:01:00",
        next_at: next, last_slot_at: null, last_job_id: null, last_job_state: null, skipped: "0",
      });
    });
  });

  it("upserts by name: same cron and timezone keep next_at (no due slot lost); a new cron starts after now()", async () => {
    await inRollback(db.pool, async (c) => {
      const name = unique("up");
      await schedule(c, { name, cron: "*/5 * * * *" });
      await setNextAt(c, name, "2026-01-01T00:00:00Z");
      await schedule(c, { name, cron: "*/5 * * * *", task: "renamed", payload: { a: 1 }, queue: "q2", overlap: "allow", misfire: "all" });
      expect(await scheduleRow(c, name)).toMatchObject({
        task: "renamed", payload: { a: 1 }, queue: "q2", overlap: "allow", misfire: "all", next_at: new Date("2026-01-01T00:00:00Z"),
      });
      expect(await count(c, "SELECT 1 FROM idemq.schedules WHERE name = $1", [name])).toBe(1);
      const next = await schedule(c, { name, cron: "0 * * * *" });
      const { rows } = await c.query<{ now: Date }>("SELECT now() AS now");
      expect(next.getTime()).toBeGreaterThan(rows[0]!.now.getTime());
      expect((await scheduleRow(c, name))!.next_at).toEqual(next);
    });
  });

  it("an unchanged definition writes nothing (same row version, updated_at kept); any changed field is written", async () => {
    const name = unique("same");
    const version = async () =>
      (await db.pool.query<{ ctid: string; updated_at: Date; next_at: Date }>(
        "SELECT ctid::text AS ctid, updated_at, next_at FROM idemq.schedules WHERE name = $1",
        [name],
      )).rows[0]!;
    const definition = { name, cron: "*/5 * * * *", payload: { a: [1, 2] }, misfire_grace: "90 seconds" };
    await schedule(db.pool, definition);
    const first = await version();
    // Separate transactions, so a write would show in updated_at (now()) as well as in the row version.
    expect(await schedule(db.pool, { ...definition, misfire_grace: "00:01:30" })).toEqual(first.next_at);
    expect(await schedule(db.pool, { ...definition, payload: { a: [1, 2] } })).toEqual(first.next_at);
    expect(await version()).toEqual(first);
    for (const change of [{ priority: 1 }, { task: "other" }, { payload: { a: [2, 1] } }, { overlap: "allow" as const }, { misfire_grace: "2 minutes" }]) {
      const before = await version();
      await schedule(db.pool, { ...definition, ...change });
      const after = await version();
      expect(after.ctid, JSON.stringify(change)).not.toBe(before.ctid);
      expect(after.updated_at.getTime(), JSON.stringify(change)).toBeGreaterThan(before.updated_at.getTime());
      expect(after.next_at, "same cron and timezone keep next_at").toEqual(first.next_at);
      await schedule(db.pool, definition);
    }
    await db.pool.query("SELECT idemq.unschedule(name => $1)", [name]);
  });

  it("unschedule removes it and returns true; again, false", async () => {
    await inRollback(db.pool, async (c) => {
      const name = unique("gone");
      await schedule(c, { name, cron: "@hourly" });
      const first = await c.query<{ r: boolean }>("SELECT idemq.unschedule(name => $1) AS r", [name]);
      const second = await c.query<{ r: boolean }>("SELECT idemq.unschedule(name => $1) AS r", [name]);
      expect([first.rows[0]!.r, second.rows[0]!.r]).toEqual([true, false]);
      expect(await scheduleRow(c, name)).toBeUndefined();
      await expectSqlError(c.query("SELECT idemq.unschedule(name => NULL)"), { code: "22004", hint: /\S/ });
    });
  });

  it("schedules() lists every schedule, by name", async () => {
    await inRollback(db.pool, async (c) => {
      const [a, b] = [unique("a-list"), unique("b-list")];
      await schedule(c, { name: b, cron: "@daily" });
      await schedule(c, { name: a, cron: "@daily" });
      const { rows } = await c.query<{ name: string }>("SELECT name FROM idemq.schedules() WHERE name = ANY($1)", [[a, b]]);
      expect(rows.map((r) => r.name)).toEqual([a, b]);
    });
  });
});
