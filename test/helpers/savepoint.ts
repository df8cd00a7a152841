// Expected errors inside a test's transaction: a failed statement aborts the
// whole transaction, so the statement runs under a savepoint that is rolled
// back, and the test can go on to assert what did (not) change.
import type pg from "pg";

let counter = 0;

/**
 * Runs `work` under a savepoint of the caller's transaction and always rolls
 * back to it: an error (rethrown) leaves the transaction usable, and a call
 * that succeeded leaves nothing behind. Either wrap the expectation,
 *   await underSavepoint(c, () => expectSqlError(c.query(...), { code: "IQ410" }));
 * or be wrapped by it:
 *   await expectSqlError(underSavepoint(c, () => c.query(...)), { code: "IQ410" });
 */
export async function underSavepoint<T>(client: pg.ClientBase, work: () => Promise<T>): Promise<T> {
  const name = `under_savepoint_${++counter}`;
  await client.query(`SAVEPOINT ${name}`);
  try {
    return await work();
  } finally {
    await client.query(`ROLLBACK TO SAVEPOINT ${name}`);
    await client.query(`RELEASE SAVEPOINT ${name}`);
  }
}
