// Two minimal worker loops over a pg.Pool, for the raw-SQL baseline (and the
// temporary idemq adapter): a local queue fed by batch claims with batched
// completion, and one transaction per job. Idle loops wait for a NOTIFY on
// an optional channel or for a poll timer.

import pg from "pg";

export interface BatchDriver<J> {
  /** Claims up to `max` jobs (committed: they are leased/marked running). */
  claim(pool: pg.Pool, max: number): Promise<J[]>;
  /** Runs the handler of one job (and, for transactional drivers, its whole transaction). */
  run(job: J): Promise<void>;
  /** Completes finished jobs in one statement; absent when run() completed them. */
  complete?(pool: pg.Pool, jobs: J[]): Promise<void>;
}

export interface PerJobDriver {
  /** Claims, runs and completes one job on `client`; false when none was runnable. */
  runOne(client: pg.PoolClient): Promise<boolean>;
}

export interface LoopOptions {
  pool: pg.Pool;
  concurrency: number;
  /** LISTEN here to wake an idle loop; otherwise only the poll timer wakes it. */
  listen?: { url: string; channel: string };
  pollMs: number;
  onError(err: unknown): void;
}

export interface Loop {
  stop(): Promise<void>;
}

/** Wakes idle loops on NOTIFY or after pollMs. */
class Idler {
  private wakers = new Set<() => void>();
  private listener: pg.Client | null = null;

  constructor(private readonly pollMs: number) {}

  async listen(target: LoopOptions["listen"]): Promise<void> {
    if (!target) return;
    this.listener = new pg.Client({ connectionString: target.url });
    this.listener.on("error", () => {});
    await this.listener.connect();
    this.listener.on("notification", () => this.wakeAll());
    await this.listener.query(`LISTEN "${target.channel}"`);
  }

  idle(): Promise<void> {
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.wakers.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, this.pollMs);
      this.wakers.add(wake);
    });
  }

  wakeAll(): void {
    for (const wake of [...this.wakers]) wake();
  }

  async close(): Promise<void> {
    this.wakeAll();
    await this.listener?.end().catch(() => {});
  }
}

/**
 * A fetcher keeps a local queue topped up with batch claims of `batchSize`;
 * `concurrency` runners take jobs from it; finished jobs are completed in one
 * statement, one completion in flight at a time (so completions batch up
 * while the previous one runs, like Graphile Worker's completeJobBatchDelay 0).
 */
export async function startBatchLoop<J>(
  options: LoopOptions & { batchSize: number; driver: BatchDriver<J> },
): Promise<Loop> {
  const { pool, concurrency, batchSize, driver, onError } = options;
  const idler = new Idler(options.pollMs);
  await idler.listen(options.listen);
  const queue: J[] = [];
  const waiting: Array<(job: J | null) => void> = [];
  const finished: J[] = [];
  let flushing: Promise<void> | null = null;
  let stopping = false;
  let needMore: (() => void) | null = null;

  const flush = (): void => {
    if (flushing || finished.length === 0 || !driver.complete) return;
    const batch = finished.splice(0);
    flushing = driver
      .complete(pool, batch)
      .catch(onError)
      .finally(() => {
        flushing = null;
        flush();
      });
  };

  const fetcher = (async () => {
    while (!stopping) {
      if (queue.length >= concurrency) {
        await new Promise<void>((resolve) => (needMore = resolve));
        continue;
      }
      let jobs: J[] = [];
      try {
        jobs = await driver.claim(pool, batchSize);
      } catch (err) {
        onError(err);
      }
      if (jobs.length === 0) {
        await idler.idle();
        continue;
      }
      for (const job of jobs) {
        const runner = waiting.shift();
        if (runner) runner(job);
        else queue.push(job);
      }
    }
  })();

  const runner = async (): Promise<void> => {
    while (!stopping) {
      const job = queue.shift() ?? (await new Promise<J | null>((resolve) => waiting.push(resolve)));
      if (job === null) return;
      if (queue.length < concurrency && needMore) {
        const more = needMore;
        needMore = null;
        more();
      }
      try {
        await driver.run(job);
        finished.push(job);
        flush();
      } catch (err) {
        onError(err);
      }
    }
  };
  const runners = Array.from({ length: concurrency }, runner);

  return {
    async stop() {
      stopping = true;
      needMore?.();
      await idler.close();
      await fetcher;
      for (const resolve of waiting.splice(0)) resolve(null);
      await Promise.all(runners);
      while (flushing) await flushing;
    },
  };
}

/** `concurrency` loops, each handling one job per transaction on its own connection. */
export async function startPerJobLoop(options: LoopOptions & { driver: PerJobDriver }): Promise<Loop> {
  const { pool, concurrency, driver, onError } = options;
  const idler = new Idler(options.pollMs);
  await idler.listen(options.listen);
  let stopping = false;
  const loops = Array.from({ length: concurrency }, async () => {
    const client = await pool.connect();
    try {
      while (!stopping) {
        let found = false;
        try {
          found = await driver.runOne(client);
        } catch (err) {
          await client.query("ROLLBACK").catch(() => {});
          onError(err);
        }
        if (!found && !stopping) await idler.idle();
      }
    } finally {
      client.release();
    }
  });
  return {
    async stop() {
      stopping = true;
      await idler.close();
      await Promise.all(loops);
    },
  };
}
