// What every command shares, run as real subprocesses: --help with examples,
// --json and --database-url; exit codes documented in `idemq --help`; and bad
// input (unknown command or option, unreachable or malformed database URL, a
// database without the schema) as one line naming what was wrong and the fix,
// never a stack trace, changing nothing.
import { describe, expect, it } from "vitest";
import type { Command } from "commander";
import { EXIT, EXIT_CODES_HELP } from "../../src/cli/exit-codes.ts";
import { buildProgram } from "../../src/cli/main.ts";
import { type CliResult, runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";

const COMMANDS = [
  ["enqueue"],
  ["jobs"],
  ["jobs", "show"],
  ["jobs", "retry"],
  ["jobs", "cancel"],
  ["jobs", "delete"],
  ["jobs", "run-now"],
  ["jobs", "reschedule"],
  ["schedules", "list"],
  ["schedules", "add"],
  ["schedules", "remove"],
  ["schedules", "next"],
  ["limit", "list"],
  ["limit", "keys"],
  ["limit", "set"],
  ["limit", "clear"],
  ["pause"],
  ["resume"],
  ["stats"],
  ["rescue"],
  ["purge"],
  ["prune-keys"],
  ["doctor"],
];

/** A valid invocation of each command, for the connection failures. */
const INVOCATIONS = [
  ["enqueue", "t", '{"a": 1}'],
  ["jobs"],
  ["jobs", "show", "1"],
  ["jobs", "retry", "1"],
  ["jobs", "cancel", "1"],
  ["jobs", "delete", "1", "--yes"],
  ["jobs", "run-now", "--queue", "q", "--yes"],
  ["jobs", "reschedule", "1", "--delay", "1m"],
  ["schedules", "list"],
  ["schedules", "add", "nightly", "--cron", "@daily", "--task", "t"],
  ["schedules", "remove", "nightly"],
  ["schedules", "next", "--cron", "@daily"],
  ["limit", "list"],
  ["limit", "keys"],
  ["limit", "set", "--queue", "q", "--concurrency", "2"],
  ["limit", "clear", "--queue", "q"],
  ["pause", "--queue", "q"],
  ["resume", "--queue", "q"],
  ["stats"],
  ["rescue"],
  ["purge", "--older-than", "7d"],
  ["prune-keys"],
  ["doctor"],
];

const empty = useTestDatabase({ empty: true });

function oneLine(result: CliResult): string {
  expect(result.stderr).not.toMatch(/^\s+at /m);
  const lines = result.stderr.trimEnd().split("\n");
  expect(lines, result.stderr).toHaveLength(1);
  expect(lines[0]).toMatch(/^idemq: /);
  return lines[0]!;
}

describe("help", () => {
  it("idemq --help lists every command, the database choice, IDEMQ_DATA_DIR and every exit code", async () => {
    const result = await runCli(["--help"]);
    expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
    for (const [name] of COMMANDS) expect(result.stdout).toMatch(new RegExp(`^  ${name!} `, "m"));
    expect(result.stdout).toContain("IDEMQ_DATA_DIR");
    expect(result.stdout).toContain("embedded");
    expect(result.stdout).toContain(EXIT_CODES_HELP);
    for (const code of Object.values(EXIT)) expect(EXIT_CODES_HELP).toMatch(new RegExp(`^  ${code} `, "m"));
  });

  for (const command of COMMANDS) {
    it(`idemq ${command.join(" ")} --help shows its options and an example`, async () => {
      const result = await runCli([...command, "--help"]);
      expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
      expect(result.stdout).toMatch(new RegExp(`^Usage: idemq ${command.join(" ")} `));
      expect(result.stdout).toContain("--json");
      expect(result.stdout).toContain("--database-url <url>");
      expect(result.stdout).toMatch(new RegExp(`\\nExamples:\\n {2}idemq ${command[0]}`));
    });
  }
});

describe("every --help has examples", () => {
  /** Every command of the CLI's tree ("migrate status", "worker", ...), the program itself left out. */
  const everyCommand = (): string[][] => {
    const found: string[][] = [];
    const walk = (command: Command, path: string[]): void => {
      for (const sub of command.commands) {
        if (sub.name() === "help") continue;
        found.push([...path, sub.name()]);
        walk(sub, [...path, sub.name()]);
      }
    };
    walk(buildProgram(), []);
    return found;
  };

  it("the tree has the commands this file checks by name, and more", () => {
    const names = everyCommand().map((c) => c.join(" "));
    for (const command of COMMANDS) expect(names).toContain(command.join(" "));
    for (const name of ["migrate", "migrate status", "migrate sql", "worker", "roles", "demo"]) expect(names).toContain(name);
  });

  for (const command of everyCommand()) {
    it(`idemq ${command.join(" ")} --help ends with an Examples: section of idemq (or npm) command lines`, async () => {
      const result = await runCli([...command, "--help"]);
      expect(result).toMatchObject({ code: EXIT.OK, stderr: "" });
      expect(result.stdout).toMatch(/\nExamples:\n {2}(idemq|npm) /);
    });
  }
});

describe("bad input: one line, the fix, no stack trace", () => {
  it("an unknown command names the closest one and the help (exit 2)", async () => {
    const result = await runCli(["jbos"]);
    expect(result).toMatchObject({ code: EXIT.USAGE, stdout: "" });
    expect(oneLine(result)).toBe("idemq: unknown command 'jbos' (Did you mean jobs?); see `idemq --help`");
  });

  it("an unknown option names the command's help (exit 2)", async () => {
    const result = await runCli(["stats", "--wacth"]);
    expect(result).toMatchObject({ code: EXIT.USAGE, stdout: "" });
    expect(oneLine(result)).toBe("idemq: unknown option '--wacth' (Did you mean --watch?); see `idemq stats --help`");
  });

  for (const args of INVOCATIONS) {
    it(`an unreachable database: idemq ${args.join(" ")} names host:port and the fix (exit 1)`, async () => {
      const result = await runCli([...args, "--database-url", "postgres://postgres@127.0.0.1:1/idemq"]);
      expect(result).toMatchObject({ code: EXIT.FAILURE, stdout: "" });
      expect(oneLine(result)).toBe(
        "idemq: cannot connect to the database at 127.0.0.1:1: connection refused (no server listens there); " +
          "start PostgreSQL or fix --database-url or DATABASE_URL, or leave both unset to use the embedded PostgreSQL",
      );
    });
  }

  it("every duration option refuses a bare number the same way, naming the option and the units to add (exit 2)", async () => {
    // Read from the CLI's own tree, so a new duration option is held to the same rule.
    const durationOptions: { command: string[]; flags: string; long: string }[] = [];
    const walk = (command: Command, path: string[]): void => {
      for (const sub of command.commands) {
        for (const option of sub.options) {
          if (option.flags.endsWith("<duration>")) durationOptions.push({ command: [...path, sub.name()], flags: option.flags, long: option.long! });
        }
        walk(sub, [...path, sub.name()]);
      }
    };
    walk(buildProgram(), []);
    expect(durationOptions.map((o) => `${o.command.join(" ")} ${o.long}`)).toEqual(
      expect.arrayContaining(["enqueue --delay", "jobs reschedule --delay", "purge --older-than", "prune-keys --older-than", "worker --wait-for-database"]),
    );
    for (const { command, flags, long } of durationOptions) {
      // The value is refused as it is read: no database is opened (the URL names none that answers).
      const result = await runCli([...command, long, "5", "--database-url", "postgres://postgres@127.0.0.1:1/idemq"]);
      expect(result, `${command.join(" ")} ${long} 5`).toMatchObject({ code: EXIT.USAGE, stdout: "" });
      expect(oneLine(result)).toBe(
        `idemq: option '${flags}' argument '5' is invalid. 5 has no unit: write 5s, 5m, 5h or 5d; see \`idemq ${command.join(" ")} --help\``,
      );
    }
  });

  it("DATABASE_URL is read like --database-url, and named in the same way", async () => {
    const result = await runCli(["stats"], { env: { DATABASE_URL: "postgres://postgres@127.0.0.1:1/idemq" } });
    expect(result.code).toBe(EXIT.FAILURE);
    expect(oneLine(result)).toContain("cannot connect to the database at 127.0.0.1:1");
  });

  it("a database that does not exist, and a URL that is not one", async () => {
    const missing = await runCli(["stats", "--database-url", `${empty.url}_missing`]);
    expect(missing.code).toBe(EXIT.FAILURE);
    expect(oneLine(missing)).toContain(`database ${empty.name}_missing does not exist; create it (createdb ${empty.name}_missing)`);

    const malformed = await runCli(["stats", "--database-url", "localhost:5432"]);
    expect(malformed.code).toBe(EXIT.USAGE);
    expect(oneLine(malformed)).toBe(
      "idemq: the database URL starts with localhost://: give postgres://user:password@host:5432/database",
    );
    const garbage = await runCli(["stats", "--database-url", "not a url"]);
    expect(garbage.code).toBe(EXIT.USAGE);
    expect(oneLine(garbage)).toContain("the database URL is not a connection string");
  });

  it("a database without the idemq schema: exit 1 naming `idemq migrate`, and nothing is created", async () => {
    for (const args of [["stats"], ["enqueue", "t", "{}"], ["jobs", "--json"], ["schedules", "add", "n", "--cron", "@daily", "--task", "t"]]) {
      const result = await runCli([...args, "--database-url", empty.url]);
      expect(result.code).toBe(EXIT.FAILURE);
      // Under --json the same message is the error object on stdout.
      if (args.includes("--json")) expect(JSON.parse(result.stdout).error.message).toBe(oneLine(result).replace(/^idemq: /, ""));
      else expect(result.stdout).toBe("");
      expect(oneLine(result)).toBe(
        `idemq: database ${empty.name} at 127.0.0.1:${new URL(empty.url).port || "5432"} has no idemq schema ` +
          "(or it is older than this version of idemq): " +
          "run `idemq migrate --database-url <url>` (or `idemq migrate sql` for a script to apply with psql)",
      );
    }
    const { rows } = await empty.pool.query("SELECT to_regnamespace('idemq') AS ns, to_regnamespace('idemq_meta') AS meta");
    expect(rows[0]).toEqual({ ns: null, meta: null });
  });

  it("with --json, a failure writes one error object on stdout and still one line on stderr", async () => {
    const result = await runCli(["jobs", "show", "1", "--json", "--database-url", "postgres://postgres@127.0.0.1:1/x"]);
    expect(result.code).toBe(EXIT.FAILURE);
    expect(result.stdout.trimEnd().split("\n")).toHaveLength(1);
    expect(JSON.parse(result.stdout)).toEqual({
      error: { code: "connection", message: expect.stringContaining("cannot connect to the database at 127.0.0.1:1"), hint: null },
    });
    oneLine(result);
  });

  for (const args of INVOCATIONS) {
    it(`--json: idemq ${args.join(" ")} reports an unreachable database as one { error: { code, message, hint } } on stdout`, async () => {
      const result = await runCli([...args, "--json", "--database-url", "postgres://postgres@127.0.0.1:1/idemq"]);
      expect(result.code).toBe(EXIT.FAILURE);
      const lines = result.stdout.trimEnd().split("\n");
      expect(lines).toHaveLength(1);
      const shown = JSON.parse(lines[0]!);
      expect(Object.keys(shown)).toEqual(["error"]);
      expect(shown.error).toEqual({ code: "connection", message: expect.stringMatching(/^cannot connect to the database at 127\.0\.0\.1:1: /), hint: null });
      expect(oneLine(result)).toBe(`idemq: ${shown.error.message}`);
    });
  }

  it("--json: commander's own errors (unknown option, missing argument) are the same object, code usage", async () => {
    const unknown = await runCli(["stats", "--wacth", "--json"]);
    expect(unknown.code).toBe(EXIT.USAGE);
    expect(JSON.parse(unknown.stdout)).toEqual({
      error: { code: "usage", message: "unknown option '--wacth' (Did you mean --watch?)", hint: "see `idemq stats --help`" },
    });
    oneLine(unknown);
    const missing = await runCli(["jobs", "show", "--json"]);
    expect(missing.code).toBe(EXIT.USAGE);
    expect(JSON.parse(missing.stdout)).toEqual({
      error: { code: "usage", message: "missing required argument 'id'", hint: "see `idemq jobs show --help`" },
    });
    const bad = await runCli(["jobs", "show", "42abc", "--json", "--database-url", "postgres://postgres@127.0.0.1:1/x"]);
    expect(bad.code).toBe(EXIT.USAGE);
    expect(JSON.parse(bad.stdout).error).toMatchObject({ code: "usage", message: expect.stringContaining('not "42abc"') });
  });
});
