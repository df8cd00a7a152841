// A library call on a database without the idemq schema (or with an older
// one) throws SchemaMissingError: it names the database and `idemq migrate`,
// carries PostgreSQL's SQLSTATE, and keeps the original error as its cause.
import pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { Client, createWorker, IdemqError, SchemaMissingError } from "../../src/index.ts";
import { fromPgError } from "../../src/errors.ts";
import { PACKAGE_VERSION } from "../../src/schema-check.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { MIGRATION_NAMES } from "../helpers/migrations.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const FIX =
  "has no idemq schema (or it is older than this version of idemq): " +
  "run `idemq migrate --database-url <url>` (or `idemq migrate sql` for a script to apply with psql)";

/** An empty database, and one with a schema idemq holding an enqueue of an earlier shape only. */
const empty = useTestDatabase({ empty: true, poolSize: 2 });
const older = useTestDatabase({ empty: true, poolSize: 2 });
beforeAll(async () => {
  await older.pool.query(`
    CREATE SCHEMA idemq;
    CREATE FUNCTION idemq.enqueue(task text) RETURNS TABLE (job_id bigint, deduplicated boolean)
      LANGUAGE sql AS 'SELECT 1::bigint, false'`);
});

async function rejection(promise: Promise<unknown>): Promise<SchemaMissingError> {
  const error = await promise.then(
    () => {
      throw new Error("expected the call to fail, but it succeeded");
    },
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(SchemaMissingError);
  expect(error).toBeInstanceOf(IdemqError);
  return error as SchemaMissingError;
}

describe("Client on an unmigrated database", () => {
  it("enqueue: 3F000, the database named, `idemq migrate` the fix, PostgreSQL's error the cause", async () => {
    const client = new Client({ connectionString: empty.url });
    try {
      const error = await rejection(client.enqueue("send_greeting", { name: "Ada" }));
      expect(error.message).toBe(`database ${empty.name} ${FIX}`);
      expect(error.database).toBe(empty.name);
      expect(error.code).toBe("3F000");
      expect(error.detail).toBe('schema "idemq" does not exist');
      expect(error.cause).toBeInstanceOf(pg.DatabaseError);
      expect((error.cause as pg.DatabaseError).code).toBe("3F000");
    } finally {
      await client.close();
    }
  });

  it("on a pool or in the caller's transaction too; enqueueMany, getJob and listJobs as well", async () => {
    const client = new Client({ pool: empty.pool });
    const named = `database ${empty.name} ${FIX}`;
    expect((await rejection(client.enqueueMany([{ task: "t" }]))).message).toBe(named);
    // getJob calls idemq.job(): no schema, as for the other calls.
    const got = await rejection(client.getJob("1"));
    expect([got.message, got.code]).toEqual([named, "3F000"]);
    // listJobs calls idemq.find_jobs(): no schema either.
    const read = await rejection(client.listJobs());
    expect([read.message, read.code]).toEqual([named, "3F000"]);
    const tx = await empty.pool.connect();
    try {
      await tx.query("BEGIN");
      expect((await rejection(client.enqueue("t", {}, { client: tx }))).message).toBe(named);
    } finally {
      await tx.query("ROLLBACK");
      tx.release();
    }
  });

  it("an older schema, whose enqueue lacks a parameter this version passes: 42883, the same fix", async () => {
    const client = new Client({ pool: older.pool });
    const error = await rejection(client.enqueue("t", { a: 1 }));
    expect(error.message).toBe(`database ${older.name} ${FIX}`);
    expect(error.code).toBe("42883");
    // The client passes the leading arguments by position (src/sql/call.ts, buildCall).
    expect(error.detail).toMatch(/^function idemq\.enqueue\(unknown, unknown\) does not exist/);
  });

  it("the same SQLSTATE from a schema that is not idemq's is left as PostgreSQL's error", async () => {
    const error = await empty.pool.query("SELECT * FROM elsewhere.enqueue()").catch((e: unknown) => e);
    expect((error as pg.DatabaseError).code).toBe("3F000");
    expect(fromPgError(error, empty.name)).toBe(error);
  });
});

describe("createWorker().start() on an unmigrated database", () => {
  it("rejects with the fix, and the worker ends stopped with its connections closed", async () => {
    const worker = createWorker({ connectionString: empty.url, handleSignals: false, tasks: { t: async () => {} } });
    const error = await rejection(worker.start());
    expect(error.message).toBe(`database ${empty.name} ${FIX}`);
    expect(error.code).toBe("3F000");
    await worker.wait();
    // Its pool is closed: the connection that found no schema goes away (a backend exits just after its socket closes).
    await waitFor(
      async () => {
        const { rows } = await empty.pool.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'idemq-%'",
        );
        return rows[0]!.n === 0;
      },
      { what: "the worker's connections to close" },
    );
  });

  it("an older schema: 42883, naming the missing functions and parameters, and both versions", async () => {
    const worker = createWorker({ pool: older.pool, handleSignals: false, tasks: { t: async () => {} } });
    const error = await rejection(worker.start());
    expect(error.message).toBe(
      `database ${older.name} has an idemq schema older than 0.2.0, older than this idemq ${PACKAGE_VERSION} (migration ${MIGRATION_NAMES.at(-1)}): ` +
        "run `idemq migrate --database-url <url>` (or `idemq migrate sql` for a script to apply with psql)",
    );
    expect(error.code).toBe("42883");
    expect(error.detail).toContain("idemq.enqueue(task, payload, queue,");
    expect(error.detail).toContain("idemq.claim(worker_id, queues, batch_size, lease, tasks, token)");
    await worker.wait();
  });
});
