// The raw-SQL baseline: roughly the physical limit of a PostgreSQL queue on
// this machine. A minimal table with one partial index on ready rows; claim is
// UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n), completion
// deletes by an id array. No leases, retries, keys ledger or history.

import pg from "pg";
import { startBatchLoop, startPerJobLoop } from "./loops.ts";
import { LEDGER_DDL, LEDGER_INSERT, LEDGER_TASK, type BenchPayload, type System } from "./types.ts";

const CHANNEL = "raw_jobs";
const BATCH = 100;

interface RawJob {
  id: string;
  task: string;
  payload: BenchPayload;
}

const SCHEMA = `
  CREATE TABLE raw_jobs (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task     text NOT NULL,
    payload  jsonb NOT NULL,
    running  boolean NOT NULL DEFAULT false,
    key      text UNIQUE
  );
  CREATE INDEX raw_jobs_ready ON raw_jobs (id) WHERE NOT running;
  ${LEDGER_DDL};
`;

const CLAIM_BATCH = `
  UPDATE raw_jobs SET running = true
  WHERE id IN (SELECT id FROM raw_jobs WHERE NOT running ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
  RETURNING id, task, payload`;
const COMPLETE_BATCH = "DELETE FROM raw_jobs WHERE id = ANY ($1::bigint[])";
// One transaction per job: the row lock held by the transaction is the claim.
const CLAIM_ONE = "SELECT id, task, payload FROM raw_jobs WHERE NOT running ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED";
const COMPLETE_ONE = "DELETE FROM raw_jobs WHERE id = $1";

const INSERT_BULK = `
  INSERT INTO raw_jobs (task, payload, key)
  SELECT x.task, x.payload, x.key FROM jsonb_to_recordset($1::jsonb) AS x(task text, payload jsonb, key text)
  ON CONFLICT (key) DO NOTHING`;
const INSERT_ONE = "INSERT INTO raw_jobs (task, payload, key) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING";
const INSERT_ONE_NOTIFY = `
  WITH i AS (INSERT INTO raw_jobs (task, payload, key) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING)
  SELECT pg_notify('${CHANNEL}', '')`;

export const raw: System = {
  name: "raw",
  modes: ["batched", "perjob", "transactional"],
  tables: ["raw_jobs"],

  settings(mode, concurrency) {
    if (mode === "batched") {
      return `claims of ${BATCH} into a local queue, ${concurrency} runners, completion by id array (one in flight)`;
    }
    const extra = mode === "transactional" ? " + ledger insert" : "";
    return `${concurrency} connections, one transaction per job: SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1${extra} + DELETE`;
  },

  async setup(url) {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    await client.query(SCHEMA);
    await client.end();
  },

  async producer(url, options) {
    const pool = new pg.Pool({ connectionString: url, max: options.connections });
    pool.on("error", () => {});
    const insertOne = options.notify ? INSERT_ONE_NOTIFY : INSERT_ONE;
    return {
      async enqueueBulk(jobs) {
        await pool.query(INSERT_BULK, [JSON.stringify(jobs.map((j) => ({ task: j.task, payload: j.payload, key: j.key })))]);
      },
      async enqueueOne(job) {
        await pool.query(insertOne, [job.task, job.payload, job.key ?? null]);
      },
      close: () => pool.end(),
    };
  },

  async remaining(db) {
    const { rows } = await db.query("SELECT count(*)::int AS n FROM raw_jobs");
    return (rows[0] as { n: number }).n;
  },

  async startWorker(spec) {
    const pool = new pg.Pool({ connectionString: spec.url, max: spec.concurrency + 2 });
    pool.on("error", () => {});
    const common = {
      pool,
      concurrency: spec.concurrency,
      listen: { url: spec.url, channel: CHANNEL },
      pollMs: 1000,
      onError: (err: unknown) => console.error("raw worker:", err),
    };
    const loop =
      spec.mode === "batched"
        ? await startBatchLoop<RawJob>({
            ...common,
            batchSize: BATCH,
            driver: {
              claim: async (p, max) => (await p.query(CLAIM_BATCH, [max])).rows as RawJob[],
              run: async (job) => spec.onJob(job.payload),
              complete: async (p, jobs) => void (await p.query(COMPLETE_BATCH, [jobs.map((j) => j.id)])),
            },
          })
        : await startPerJobLoop({
            ...common,
            driver: {
              async runOne(client) {
                await client.query("BEGIN");
                const job = (await client.query(CLAIM_ONE)).rows[0] as RawJob | undefined;
                if (!job) {
                  await client.query("COMMIT");
                  return false;
                }
                spec.onJob(job.payload);
                if (job.task === LEDGER_TASK) await client.query(LEDGER_INSERT, [`ledger:${job.payload.i}`]);
                await client.query(COMPLETE_ONE, [job.id]);
                await client.query("COMMIT");
                return true;
              },
            },
          });
    return {
      async stop() {
        await loop.stop();
        await pool.end();
      },
    };
  },
};
