// The typed-tasks declarations seen from an application: tsc over
// test/types/ with strict, nodenext, exactOptionalPropertyTypes and
// noPropertyAccessFromIndexSignature. The fixture's @ts-expect-error lines
// prove the mistakes are caught (an unused one is itself an error); a file
// with plain mistakes proves the check can fail, and names them.
import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectedMistakes, MISTAKES_SOURCE } from "../types/mistakes.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");
const FIXTURE_CONFIG = join(ROOT, "test", "types", "tsconfig.json");
const TSC = join(ROOT, "node_modules", "typescript", "bin", "tsc");
const TSC_TIMEOUT_MS = 120_000;

function tsc(config: string): Promise<{ code: number; output: string }> {
  return new Promise((done) => {
    execFile(process.execPath, [TSC, "-p", config, "--pretty", "false"], { cwd: ROOT }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof error.code === "number" ? error.code : 1;
      done({ code, output: `${stdout}${stderr}` });
    });
  });
}

let workDir: string;
beforeAll(async () => {
  workDir = await mkdtemp(join(tmpdir(), "idemq-types-"));
});
afterAll(async () => {
  if (workDir !== undefined) await rm(workDir, { recursive: true, force: true });
});

describe("typed tasks under an application's strict settings", () => {
  it(
    "test/types/typed-tasks.ts type-checks with no error (each @ts-expect-error is met)",
    async () => {
      const { code, output } = await tsc(FIXTURE_CONFIG);
      expect(output).toBe("");
      expect(code).toBe(0);
    },
    TSC_TIMEOUT_MS,
  );

  it(
    "a wrong payload, a missing field and an unknown task name fail to compile, each reported at its line",
    async () => {
      // .mts: an ES module whatever package.json the temporary directory has.
      const wrong = join(workDir, "wrong.mts");
      await writeFile(wrong, MISTAKES_SOURCE);
      const config = join(workDir, "tsconfig.json");
      await writeFile(
        config,
        JSON.stringify({
          extends: FIXTURE_CONFIG,
          // Type packages resolve from the config's directory, which is outside the project here.
          compilerOptions: { typeRoots: [join(ROOT, "node_modules", "@types")] },
          files: [wrong],
        }),
      );
      const { code, output } = await tsc(config);
      expect(code, output).not.toBe(0);
      const errors = output.split("\n").filter((line) => / error TS\d+:/.test(line));
      const expected = expectedMistakes("wrong.mts");
      expect(errors).toHaveLength(expected.length);
      // Every error is in the application's file, none in idemq's declarations.
      expected.forEach((pattern, i) => expect(errors[i]).toMatch(pattern));
    },
    TSC_TIMEOUT_MS,
  );
});
