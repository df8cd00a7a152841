// The test set-up's programs (test/helpers/system-tools.ts): which ones a
// run needs, and what the set-up does when one is missing: nothing, install
// it with apt-get, or stop the run at once with one line. Nothing here
// installs or removes a package: apt-get is a stand-in script on PATH, and a
// "missing" program is a path variable that names nothing.
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { chmod, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CHROMIUM,
  decide,
  ensureSystemTools,
  installCommand,
  locate,
  type MissingTool,
  PGBOUNCER,
  SYSTEM_TOOLS,
  toolsNeeded,
} from "./system-tools.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");
const VITEST = join(ROOT, "node_modules", "vitest", "vitest.mjs");

const missing = (tool: typeof PGBOUNCER, overridden = false): MissingTool => ({ tool, path: tool.defaultPaths[0]!, overridden });
/** A test file's import of a tool's helper, written from the tool so this file's own source imports neither. */
const importOf = (tool: typeof PGBOUNCER) => `import { x } from "../${tool.helper}";\n`;

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "idemq-system-tools-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("decide: what the set-up does about the missing programs", () => {
  it("none missing: ready, whoever runs it", () => {
    for (const root of [true, false]) for (const aptGet of [true, false]) expect(decide({ missing: [], root, aptGet })).toEqual({ kind: "ready" });
  });

  it("root with apt-get: installs the missing packages (only those), saying so in one line", () => {
    const both = decide({ missing: [missing(PGBOUNCER), missing(CHROMIUM)], root: true, aptGet: true });
    expect(both).toMatchObject({ kind: "install", packages: ["pgbouncer", "chromium"] });
    const line = (both as { line: string }).line;
    expect(line).not.toContain("\n");
    expect(line).toMatch(/^test set-up: installing pgbouncer \(the PgBouncer tests\) and chromium \(the dashboard's browser tests\) with apt-get: /);
    expect(line).toContain("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer chromium");
    expect(decide({ missing: [missing(CHROMIUM)], root: true, aptGet: true })).toMatchObject({ kind: "install", packages: ["chromium"] });
  });

  it("not root, or no apt-get: fails with one line naming what is missing, why it was not installed, and the command", () => {
    const cases = [
      { root: false, aptGet: true, why: "(here: not root)" },
      { root: true, aptGet: false, why: "(here: no apt-get on PATH)" },
      { root: false, aptGet: false, why: "(here: not root, no apt-get on PATH)" },
    ];
    for (const { root, aptGet, why } of cases) {
      const step = decide({ missing: [missing(PGBOUNCER), missing(CHROMIUM)], root, aptGet });
      expect(step.kind, why).toBe("fail");
      const line = (step as { line: string }).line;
      expect(line).not.toContain("\n");
      expect(line).toMatch(/^test set-up: pgbouncer \(the PgBouncer tests\) and chromium \(the dashboard's browser tests\) are not installed/);
      expect(line).toContain(why);
      expect(line).toContain(`run \`sudo sh -c '${installCommand(["pgbouncer", "chromium"])}'\``);
      expect(line).toContain("or set PGBOUNCER_PATH and CHROMIUM_PATH to where they are");
    }
  });

  it("a path variable naming nothing fails even as root with apt-get: the package would not put the program there", () => {
    const step = decide({ missing: [{ tool: CHROMIUM, path: "/opt/no/chromium", overridden: true }, missing(PGBOUNCER)], root: true, aptGet: true });
    expect(step).toEqual({
      kind: "fail",
      line:
        "test set-up: CHROMIUM_PATH=/opt/no/chromium does not exist (the dashboard's browser tests need it): " +
        "point it at the program, or unset CHROMIUM_PATH to use Debian's (/usr/bin/chromium)",
    });
  });
});

describe("which programs a run needs, and where they are", () => {
  it("a test file needs a program when it imports the program's helper; the suite's own files say which", async () => {
    const source = (file: string) => readFile(join(ROOT, "test", file), "utf8");
    expect(toolsNeeded([await source("worker/pgbouncer.test.ts")])).toEqual([PGBOUNCER]);
    expect(toolsNeeded([await source("worker/presence.test.ts")])).toEqual([PGBOUNCER]);
    expect(toolsNeeded([await source("dashboard/dashboard.test.ts")])).toEqual([CHROMIUM]);
    expect(toolsNeeded([await source("cli/enqueue.test.ts"), await source("helpers/system-tools.test.ts")])).toEqual([]);
    expect(toolsNeeded([importOf(CHROMIUM).replaceAll('"', "'"), importOf(PGBOUNCER)])).toEqual([PGBOUNCER, CHROMIUM]);
  });

  it("the path variable wins over the default paths; else the first default path that exists", () => {
    const none = () => false;
    expect(locate(PGBOUNCER, {}, none)).toEqual({ path: "/usr/sbin/pgbouncer", found: false, overridden: false });
    expect(locate(PGBOUNCER, {}, (p) => p === "/usr/bin/pgbouncer")).toEqual({ path: "/usr/bin/pgbouncer", found: true, overridden: false });
    expect(locate(PGBOUNCER, { PGBOUNCER_PATH: "/opt/pgb" }, (p) => p === "/opt/pgb")).toEqual({ path: "/opt/pgb", found: true, overridden: true });
    expect(locate(CHROMIUM, { CHROMIUM_PATH: "/opt/chrome" }, (p) => p === "/usr/bin/chromium")).toEqual({
      path: "/opt/chrome",
      found: false,
      overridden: true,
    });
  });
});

describe("ensureSystemTools with a stand-in apt-get", () => {
  /** A PATH holding only an `apt-get` script that records its arguments and runs `body`. */
  async function fakeAptGet(name: string, body: string) {
    const bin = await mkdtemp(join(dir, `${name}-`));
    const log = join(bin, "calls");
    await writeFile(join(bin, "apt-get"), `#!/bin/sh\necho "$DEBIAN_FRONTEND $*" >> ${log}\n${body.replaceAll("$BIN", bin)}\n`);
    await chmod(join(bin, "apt-get"), 0o755);
    return {
      env: { PATH: `${bin}:/usr/bin:/bin` },
      calls: async () => (await readFile(log, "utf8").catch(() => "")).trim().split("\n").filter(Boolean),
      /** Whether the stand-in's install has run (it touches $BIN/installed when told to). */
      installed: () => existsSync(join(bin, "installed")),
    };
  }

  async function testFile(name: string, tools: readonly (typeof PGBOUNCER)[]): Promise<string> {
    const file = join(dir, name);
    await writeFile(file, tools.map(importOf).join(""));
    return file;
  }

  it("installs what is missing: one line, apt-get update then install of the missing packages", async () => {
    const apt = await fakeAptGet("ok", 'case "$*" in *install*) touch $BIN/installed;; esac');
    const lines: string[] = [];
    await ensureSystemTools({
      files: [await testFile("both.test.ts", SYSTEM_TOOLS)],
      env: apt.env,
      root: true,
      exists: apt.installed,
      log: (line) => lines.push(line),
    });
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^test set-up: installing pgbouncer .* and chromium .* with apt-get/);
    expect(await apt.calls()).toEqual([
      "noninteractive -o DPkg::Lock::Timeout=600 update -qq",
      "noninteractive -o DPkg::Lock::Timeout=600 install -y -qq pgbouncer chromium",
    ]);
  });

  it("apt-get failing: one line with its exit code and last line, and the command to run by hand", async () => {
    const apt = await fakeAptGet("locked", 'case "$*" in *install*) echo "E: Unable to locate package chromium" >&2; exit 100;; esac');
    const run = ensureSystemTools({ files: [await testFile("chromium.test.ts", [CHROMIUM])], env: apt.env, root: true, exists: () => false, log: () => {} });
    const error = await run.then(
      () => undefined,
      (e: Error) => e,
    );
    expect(error?.message).toBe(
      "test set-up: apt-get exited 100 (E: Unable to locate package chromium); install chromium yourself: " + installCommand(["chromium"]),
    );
    expect(error?.stack, "no stack: vitest prints the line alone").toBe(error?.message);
    expect(await apt.calls()).toHaveLength(2);
  });

  it("apt-get succeeding without putting the program where it is looked for: one line naming the path", async () => {
    const apt = await fakeAptGet("useless", "exit 0");
    await expect(
      ensureSystemTools({ files: [await testFile("pgbouncer.test.ts", [PGBOUNCER])], env: apt.env, root: true, exists: () => false, log: () => {} }),
    ).rejects.toThrow(/^test set-up: apt-get left \/usr\/sbin\/pgbouncer missing; install pgbouncer yourself: apt-get update/);
  });

  it("not root: no apt-get run, the one line says how to install", async () => {
    const apt = await fakeAptGet("unused", "exit 0");
    await expect(
      ensureSystemTools({ files: [await testFile("either.test.ts", SYSTEM_TOOLS)], env: apt.env, root: false, exists: () => false, log: () => {} }),
    ).rejects.toThrow(/^test set-up: pgbouncer .* and chromium .* are not installed, .*\(here: not root\): run `sudo sh -c '/);
    expect(await apt.calls()).toEqual([]);
  });

  it("a run whose files need no program does nothing, whatever is missing", async () => {
    const apt = await fakeAptGet("idle", "exit 1");
    await ensureSystemTools({ files: [await testFile("plain.test.ts", [])], env: apt.env, root: true, exists: () => false, log: () => {} });
    expect(await apt.calls()).toEqual([]);
  });
});

describe("npm test's set-up, as a real vitest run", () => {
  function vitest(files: string[], env: Record<string, string>): Promise<{ code: number; output: string }> {
    return new Promise((done) => {
      execFile(
        process.execPath,
        [VITEST, "run", ...files],
        { cwd: ROOT, env: { ...process.env, ...env, NO_COLOR: "1" }, timeout: 120_000 },
        (error, stdout, stderr) => done({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, output: stdout + stderr }),
      );
    });
  }

  it("stops before any test runs, with one line about the programs the selected files need", async () => {
    const result = await vitest(["test/worker/presence.test.ts"], { PGBOUNCER_PATH: "/no/such/pgbouncer", CHROMIUM_PATH: "/no/such/chromium" });
    expect(result.code, result.output).toBe(1);
    const lines = result.output.split("\n").filter((l) => l.includes("test set-up:"));
    // Only PgBouncer: this run's one file does not drive a browser.
    expect(lines, result.output).toEqual([
      "Error: test set-up: PGBOUNCER_PATH=/no/such/pgbouncer does not exist (the PgBouncer tests need it): " +
        "point it at the program, or unset PGBOUNCER_PATH to use Debian's (/usr/sbin/pgbouncer)",
    ]);
    // The closing line CI reads (test/reporter.ts): no test ran, the set-up counts as the one failure.
    expect(result.output).toContain("\n0 passed, 1 failed\n");
  });
});
