// `idemq dashboard` as a real subprocess: it refuses a bind beyond loopback
// without a token (exit 2, naming --token and the variable) before touching
// the database, serves the pages and /metrics on loopback, and stops on SIGTERM.
import { afterAll, describe, expect, it } from "vitest";
import { killAll, startCli } from "../helpers/cli-spawn.ts";
import { runCli } from "../helpers/cli.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { makeJob } from "../helpers/jobs.ts";

const db = useTestDatabase({ poolSize: 2 });
afterAll(async () => {
  killAll();
});

describe("idemq dashboard", () => {
  it("refuses a non-loopback bind without a token: exit 2, naming --token and IDEMQ_DASHBOARD_TOKEN", async () => {
    const result = await runCli(["dashboard", "--host", "0.0.0.0", "--port", "0", "--database-url", "postgres://nobody@127.0.0.1:1/none"]);
    expect(result.code).toBe(2);
    expect(result.stderr).toBe(
      "idemq: binding 0.0.0.0 (not loopback) needs an auth token: pass --token TOKEN or set IDEMQ_DASHBOARD_TOKEN, or bind 127.0.0.1\n",
    );
    expect(result.stdout).toBe("");
  });

  it("refuses a token shorter than 16 characters", async () => {
    const result = await runCli(["dashboard", "--port", "0", "--database-url", db.url], { env: { IDEMQ_DASHBOARD_TOKEN: "short" } });
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/the dashboard token must be at least 16 characters \(got 5\)/);
  });

  it("serves the overview and /metrics on loopback, and exits 0 on SIGTERM", async () => {
    await makeJob(db.pool, { task: "cli_dash", queue: "cli-dash" });
    const cli = startCli(["dashboard", "--port", "0", "--database-url", db.url]);
    const line = await cli.waitForLine((l) => l.includes("dashboard at"));
    const url = /http:\/\/127\.0\.0\.1:\d+\//.exec(line)![0];
    const overview = await fetch(url);
    expect(overview.status).toBe(200);
    expect(overview.headers.get("content-security-policy")).toContain("default-src 'none'");
    expect(await overview.text()).toContain("cli-dash");
    const metrics = await fetch(`${url}metrics`);
    expect(metrics.status).toBe(200);
    expect(await metrics.text()).toMatch(/idemq_jobs\{[^}]*queue="cli-dash"[^}]*\} 1/);
    cli.child.kill("SIGTERM");
    expect((await cli.exited).code).toBe(0);
  });

  it("--help gives examples", async () => {
    const result = await runCli(["dashboard", "--help"]);
    expect(result.code).toBe(0);
    expect(result.stdout).toContain("Examples:\n  idemq dashboard ");
  });
});
