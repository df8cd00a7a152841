// Expected errors inside a test's transaction: a failed statement aborts the
// whole transaction, so each one runs under a savepoint that is rolled back,
// and the test can go on to assert what did (not) change.
import type pg from "pg";
import { expectSqlError, type ExpectedSqlError, type PgError } from "./db.ts";

let counter = 0;

/** Runs `sql` under a savepoint, asserts it fails as `expected`, and rolls back to the savepoint. */
export async function expectErrorInTx(
  client: pg.ClientBase,
  sql: string,
  params: unknown[],
  expected: ExpectedSqlError,
): Promise<PgError> {
  const name = `expect_error_${++counter}`;
  await client.query(`SAVEPOINT ${name}`);
  try {
    return await expectSqlError(client.query(sql, params), expected);
  } finally {
    await client.query(`ROLLBACK TO SAVEPOINT ${name}`);
    await client.query(`RELEASE SAVEPOINT ${name}`);
  }
}

/** The rejection of `sql` under a savepoint (rolled back), or undefined when it succeeded (its effects rolled back too). */
export async function errorInTx(client: pg.ClientBase, sql: string, params: unknown[] = []): Promise<PgError | undefined> {
  const name = `error_in_tx_${++counter}`;
  await client.query(`SAVEPOINT ${name}`);
  try {
    await client.query(sql, params);
    return undefined;
  } catch (error) {
    return error as PgError;
  } finally {
    await client.query(`ROLLBACK TO SAVEPOINT ${name}`);
    await client.query(`RELEASE SAVEPOINT ${name}`);
  }
}
