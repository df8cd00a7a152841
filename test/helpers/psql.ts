// Runs a SQL script with psql as a DBA would (-v ON_ERROR_STOP=1 -f), with
// no PG* variable of the test environment leaking into the connection.
import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

export async function psqlFile(url: string, script: string): Promise<void> {
  const tmp = await mkdtemp(join(tmpdir(), "idemq-sql-"));
  try {
    const file = join(tmp, "pending.sql");
    await writeFile(file, script);
    const env = { ...process.env };
    for (const key of Object.keys(env)) if (key.startsWith("PG")) delete env[key];
    await run("psql", ["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", file, url], { env });
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
}
