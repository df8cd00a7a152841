// The program of docs/worker.md's "Run one" runs as written against a
// migrated database: type-checked with the project's strict settings and run
// with tsx until its jobs are done, then stopped with SIGTERM. (examples/worker.js,
// the worker example, runs in test/contract/examples.test.ts, as a login with
// the roles its comments name.)
import { execFile } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { join, relative, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { killAll, startNode } from "../helpers/cli-spawn.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");

const db = useTestDatabase({ poolSize: 1 });
let workDir: string;

beforeAll(async () => {
  // Inside the repository (git-ignored .data/), so the program's `import "idemq"` is this package.
  mkdirSync(join(ROOT, ".data"), { recursive: true });
  workDir = await mkdtemp(join(ROOT, ".data", "worker-md-"));
});
afterAll(async () => {
  killAll();
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

function run(command: string, args: string[], env: NodeJS.ProcessEnv = process.env): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(command, args, { cwd: ROOT, env, timeout: 60_000 }, (error, stdout, stderr) =>
      done({ code: error ? Number(error.code ?? 1) : 0, stdout, stderr }),
    );
  });
}

/** The first ```ts block after the heading `## Run one` of docs/worker.md. */
function runOneBlock(): string {
  const doc = readFileSync(join(ROOT, "docs", "worker.md"), "utf8");
  const section = doc.slice(doc.indexOf("\n## Run one\n"));
  const block = /\n```ts\n([\s\S]*?)\n```\n/.exec(section);
  if (block === null || doc.indexOf("\n## Run one\n") < 0) throw new Error('docs/worker.md has no ```ts block under "## Run one"');
  return block[1]!;
}

describe('docs/worker.md, "Run one"', () => {
  let file: string;

  beforeAll(() => {
    file = join(workDir, "run-one.ts");
    writeFileSync(file, `${runOneBlock()}\nexport {};\n`);
  });

  it("type-checks with the project's strict settings: every name it uses is defined", async () => {
    const config = join(workDir, "tsconfig.json");
    writeFileSync(
      config,
      JSON.stringify({ extends: relative(workDir, join(ROOT, "tsconfig.json")), include: [], files: [relative(workDir, file)] }),
    );
    const result = await run(process.execPath, [join(ROOT, "node_modules", "typescript", "bin", "tsc"), "--noEmit", "-p", config]);
    expect(result.stdout + result.stderr).toBe("");
    expect(result.code).toBe(0);
  });

  it("runs each of its three tasks' jobs to success (the credit's ledger row written), then stops on SIGTERM", async () => {
    await db.pool.query("CREATE TABLE ledger (account int NOT NULL, amount int NOT NULL)");
    const client = new Client({ connectionString: db.url });
    const jobs = await Promise.all([
      client.enqueue("resize_image", { url: "https://example.com/cat.png" }),
      client.enqueue("credit", { orderId: 42, account: 7, amount: 10 }),
      client.enqueue("send_invoice", { orderId: 42, email: "ada@example.com" }),
    ]);
    const worker = startNode(["--import", "tsx", file], { env: { DATABASE_URL: db.url } });
    try {
      const results = await waitFor(
        async () => {
          const found = await Promise.all(jobs.map(({ jobId }) => client.getJob(jobId)));
          return found.every((job) => job?.state === "succeeded") ? found.map((job) => job!.result) : undefined;
        },
        { what: `the three jobs to succeed; worker stderr: ${worker.stderr()}` },
      );
      expect(results).toEqual([
        { url: "https://example.com/cat.png", width: 800 },
        null,
        { messageId: "msg-invoice-email:42", to: "ada@example.com" },
      ]);
      const { rows } = await db.pool.query("SELECT account, amount FROM ledger");
      expect(rows).toEqual([{ account: 7, amount: 10 }]);
      expect(worker.child.exitCode).toBeNull();
    } finally {
      worker.child.kill("SIGTERM");
      await client.close();
    }
    const { code, signal, stderr } = await worker.exited;
    expect({ code, signal, stderr }).toEqual({ code: 0, signal: null, stderr: "" });
  });
});
