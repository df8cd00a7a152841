// A PgBouncer of one test file's own, in front of a PostgreSQL server: the
// Debian `pgbouncer` binary (found and, when missing, installed by the test
// set-up: ./system-tools.ts), a config in a temporary directory, a free
// loopback port, trust authentication, and the given pool mode (transaction pooling is what production poolers run). As
// root it runs as the `postgres` OS user (PgBouncer refuses root).
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { chown, mkdtemp, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "./private-cluster.ts";
import { PGBOUNCER, toolPath } from "./system-tools.ts";

export interface PgBouncer {
  port: number;
  /** A connection string for `database` through the pooler, as user postgres. */
  url(database: string): string;
  stop(): Promise<void>;
}

export async function startPgBouncer(options: {
  serverPort: number;
  serverHost?: string;
  poolMode?: "transaction" | "session" | "statement";
  poolSize?: number;
  /**
   * Startup parameters PgBouncer lets through (ignore_startup_parameters).
   * Default: extra_float_digits and options. [] is a stock PgBouncer, which
   * refuses a connection that sends any parameter it does not track.
   */
  ignoreStartupParameters?: readonly string[];
}): Promise<PgBouncer> {
  const binary = toolPath(PGBOUNCER);
  const dir = await mkdtemp(join(tmpdir(), "idemq-pgbouncer-"));
  const port = await freePort();
  const config = join(dir, "pgbouncer.ini");
  const ignored = options.ignoreStartupParameters ?? ["extra_float_digits", "options"];
  await writeFile(join(dir, "userlist.txt"), '"postgres" ""\n');
  await writeFile(
    config,
    [
      "[databases]",
      `* = host=${options.serverHost ?? "127.0.0.1"} port=${options.serverPort}`,
      "[pgbouncer]",
      "listen_addr = 127.0.0.1",
      `listen_port = ${port}`,
      `unix_socket_dir = ${dir}`,
      "auth_type = trust",
      `auth_file = ${join(dir, "userlist.txt")}`,
      `pool_mode = ${options.poolMode ?? "transaction"}`,
      `default_pool_size = ${options.poolSize ?? 20}`,
      "max_client_conn = 500",
      // Clients that send these at startup (psql, some drivers) would be refused otherwise.
      ...(ignored.length > 0 ? [`ignore_startup_parameters = ${ignored.join(",")}`] : []),
      `logfile = ${join(dir, "pgbouncer.log")}`,
      "",
    ].join("\n"),
  );
  const asRoot = process.getuid?.() === 0;
  if (asRoot) {
    const uid = Number(execFileSync("id", ["-u", "postgres"], { encoding: "utf8" }));
    const gid = Number(execFileSync("id", ["-g", "postgres"], { encoding: "utf8" }));
    for (const path of [dir, config, join(dir, "userlist.txt")]) await chown(path, uid, gid);
  }
  const child: ChildProcess = asRoot
    ? spawn("runuser", ["-u", "postgres", "--", binary, config], { stdio: "ignore" })
    : spawn(binary, [config], { stdio: "ignore" });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  await waitForPort(port, exited);
  return {
    port,
    url: (database) => `postgres://postgres@127.0.0.1:${port}/${database}`,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        // SIGTERM: at once. SIGINT (a safe shutdown) waits for idle server connections a session pooler never lets go.
        child.kill("SIGTERM");
        await exited;
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** Resolves once something accepts connections on the port; rejects if the process exits first. */
async function waitForPort(port: number, exited: Promise<void>): Promise<void> {
  let gone = false;
  void exited.then(() => (gone = true));
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (gone) throw new Error("pgbouncer exited at start (see its log)");
    const open = await new Promise<boolean>((resolve) => {
      const socket = net.connect(port, "127.0.0.1");
      socket.once("connect", () => (socket.destroy(), resolve(true)));
      socket.once("error", () => resolve(false));
    });
    if (open) return;
    if (Date.now() > deadline) throw new Error(`pgbouncer did not listen on ${port} within 10 s`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}
