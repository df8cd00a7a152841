// A PostgreSQL cluster of one test file's own, for tests that stop, crash or
// restart the server: initdb into a temporary directory, a free loopback
// port, the machine's PostgreSQL binaries (pg_config --bindir, else the newest
// /usr/lib/postgresql/N/bin), run as the `postgres` OS user when the tests run
// as root (PostgreSQL refuses root). The shared server is never touched.
import { execFile, execFileSync } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { chown, mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import pg from "pg";
import { migrate } from "../../src/migrate.ts";

const run = promisify(execFile);

export interface PrivateCluster {
  port: number;
  /** A connection string for `database` (default postgres) as the superuser postgres. */
  url(database?: string): string;
  /** pg_ctl stop -m fast (clean shutdown) or -m immediate (a crash: recovery at the next start). */
  stop(mode: "fast" | "immediate"): Promise<void>;
  start(): Promise<void>;
  /** Stops the server if it runs and removes its directory. */
  destroy(): Promise<void>;
}

function binDir(): string {
  try {
    const dir = execFileSync("pg_config", ["--bindir"], { encoding: "utf8" }).trim();
    if (existsSync(join(dir, "initdb"))) return dir;
  } catch {
    // No pg_config on PATH: look where Debian installs the server.
  }
  const root = "/usr/lib/postgresql";
  const versions = existsSync(root) ? readdirSync(root).filter((v) => existsSync(join(root, v, "bin", "initdb"))) : [];
  const newest = versions.sort((a, b) => Number(b) - Number(a))[0];
  if (newest === undefined) throw new Error("no PostgreSQL server binaries (initdb) found: install postgresql");
  return join(root, newest, "bin");
}

/** A loopback port nobody listens on right now. */
export function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const probe = net.createServer();
    probe.on("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      probe.close(() => (typeof address === "object" && address !== null ? resolvePort(address.port) : reject(new Error("no port"))));
    });
  });
}

export async function startPrivateCluster(): Promise<PrivateCluster> {
  const bin = binDir();
  const dir = await mkdtemp(join(tmpdir(), "idemq-cluster-"));
  const asRoot = process.getuid?.() === 0;
  if (asRoot) {
    const uid = Number(execFileSync("id", ["-u", "postgres"], { encoding: "utf8" }));
    const gid = Number(execFileSync("id", ["-g", "postgres"], { encoding: "utf8" }));
    await chown(dir, uid, gid);
  }
  const pgBin = (command: string, args: string[]) =>
    asRoot ? run("runuser", ["-u", "postgres", "--", join(bin, command), ...args]) : run(join(bin, command), args);
  const data = join(dir, "data");
  await pgBin("initdb", ["-D", data, "-U", "postgres", "-A", "trust", "--no-sync"]);
  const port = await freePort();
  let running = false;
  const cluster: PrivateCluster = {
    port,
    url: (database = "postgres") => `postgres://postgres@127.0.0.1:${port}/${database}`,
    async start() {
      const settings = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off`;
      await pgBin("pg_ctl", ["-D", data, "-l", join(dir, "server.log"), "-o", settings, "-w", "start"]);
      running = true;
    },
    async stop(mode) {
      await pgBin("pg_ctl", ["-D", data, "-m", mode, "-w", "stop"]);
      running = false;
    },
    async destroy() {
      if (running) await cluster.stop("immediate").catch(() => {});
      await rm(dir, { recursive: true, force: true });
    },
  };
  await cluster.start();
  return cluster;
}

/**
 * A private cluster with a database "idemq" migrated to the current schema,
 * as the restart, PgBouncer and presence tests start from; `url` is that
 * database's connection string.
 */
export async function startMigratedCluster(): Promise<{ cluster: PrivateCluster; url: string }> {
  const cluster = await startPrivateCluster();
  const admin = new pg.Client({ connectionString: cluster.url() });
  await admin.connect();
  await admin.query("CREATE DATABASE idemq");
  await admin.end();
  const url = cluster.url("idemq");
  await migrate({ connectionString: url });
  return { cluster, url };
}
