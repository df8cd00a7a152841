// @ts-check
// A worker from start to finish: enqueue a few jobs, run a worker until they
// are done, print what happened, stop. It uses the database in DATABASE_URL
// (migrated once: `npx idemq migrate`), or, with DATABASE_URL unset, the
// embedded PostgreSQL that `npx idemq dev` runs in the same directory:
//
//   node node_modules/idemq/examples/worker.js   # in an app that installed idemq
//   node examples/worker.js                      # in a clone of the repository (after npm ci)
//
// Plain JavaScript, checked by TypeScript through its JSDoc types (// @ts-check);
// in a TypeScript app the same code takes type annotations instead.
//
// It runs as the role an application would use: a login that is a member of
// this database's producer and worker roles and of no other idemq role, with
// no privilege on idemq's tables (it reads its jobs with Client.getJob, i.e.
// idemq.job()). It creates one table of its own, example_ledger, so it
// needs CREATE on a schema in its search_path (PostgreSQL 15 and later give
// PUBLIC none on schema public):
//
//   npx idemq migrate --database-url "$OWNER_URL"      # as the schema's owner
//   npx idemq roles grant app --producer --worker --database-url "$OWNER_URL"
//   psql "$OWNER_URL" -c 'GRANT CREATE ON SCHEMA public TO app'
//
// test/contract/examples.test.ts runs it as such a login.
//
// It shows the three ways a second delivery is made harmless: a transactional
// task guarded by a business key (two deliveries of one credit, one ledger
// row), ctx.effect for an email (claim first, the key passed to the email
// API), and retries with a fixed backoff, with an error class that is never
// retried.
import { Client, createWorker } from "idemq";

// No connection string: DATABASE_URL, else the server of `npx idemq dev` (the error says so when neither is there).
const idemq = new Client();
await idemq.pool.query(
  "CREATE TABLE IF NOT EXISTS example_ledger (order_id bigint NOT NULL, amount int NOT NULL, job_id bigint NOT NULL)",
);

// A stand-in for an email API that honours idempotency keys: a key it has
// seen returns the first answer again instead of sending a second email.
/** @type {Map<string, { messageId: string }>} */
const sentEmails = new Map();
const emailApi = {
  /**
   * @param {string} to
   * @param {string} subject
   * @param {{ idempotencyKey: string }} opts
   * @returns {Promise<{ messageId: string }>}
   */
  async send(to, subject, opts) {
    let answer = sentEmails.get(opts.idempotencyKey);
    if (answer === undefined) {
      answer = { messageId: `msg-${sentEmails.size + 1}` };
      sentEmails.set(opts.idempotencyKey, answer);
      console.log(`  [email api] sent "${subject}" to ${to}`);
    }
    return answer;
  },
};

class InvalidAddress extends Error {}

const worker = createWorker({
  queues: ["example"],
  concurrency: 5,
  tasks: {
    // One ledger row per order, however many times the credit is delivered:
    // the guard row commits in the same transaction as the ledger row.
    credit: {
      transactional: true,
      guardKey: (/** @type {{ orderId: number }} */ p) => `example-credit:order-${p.orderId}`,
      run: async (/** @type {{ orderId: number; amount: number }} */ p, ctx) => {
        await ctx.tx.query("INSERT INTO example_ledger (order_id, amount, job_id) VALUES ($1, $2, $3)", [
          p.orderId,
          p.amount,
          ctx.job.id,
        ]);
      },
    },
    // An effect outside the database, once per key.
    send_receipt: {
      maxAttempts: 3,
      backoff: { kind: "fixed", delays: ["200ms", "500ms"] },
      exceptOn: [InvalidAddress],
      run: async (/** @type {{ orderId: number; to: string }} */ p, ctx) => {
        if (!p.to.includes("@")) throw new InvalidAddress(`not an email address: ${p.to}`);
        return ctx.effect(`example-receipt:order-${p.orderId}`, (key) =>
          emailApi.send(p.to, `Receipt for order ${p.orderId}`, { idempotencyKey: key }),
        );
      },
    },
    // Fails once, then succeeds on its retry.
    flaky_report: {
      backoff: { kind: "fixed", delays: ["100ms"] },
      run: async (_p, ctx) => {
        if (ctx.job.attempt === 1) throw new Error("the report service timed out");
        ctx.log.info("report built", { rows: 42 });
        return { rows: 42 };
      },
    },
  },
});

/** @param {string} what */
const show = (what) => (/** @type {{ task: string; jobId: string; attempt: number; error?: { message: string } }} */ e) =>
  console.log(`${what.padEnd(10)} ${e.task}#${e.jobId} attempt ${e.attempt}${e.error ? `: ${e.error.message}` : ""}`);
worker.on("job:success", show("success"));
worker.on("job:duplicate", show("duplicate"));
worker.on("job:retry", show("retry"));
worker.on("job:failed", show("failed"));
worker.on("log", (line) => console.log(`log        ${line.task}#${line.jobId}: ${line.message}`));
worker.on("worker:error", ({ during, error }) => console.error(`worker error during ${during}: ${error.message}`));

await worker.start();

// Order numbers unique to this run (guard keys outlive the jobs, as they must).
const order = Date.now();
const jobs = await idemq.enqueueMany([
  { task: "credit", payload: { orderId: order, amount: 10 }, queue: "example" },
  { task: "credit", payload: { orderId: order, amount: 10 }, queue: "example" }, // delivered twice
  { task: "credit", payload: { orderId: order + 1, amount: 25 }, queue: "example" },
  { task: "send_receipt", payload: { orderId: order, to: "ada@example.com" }, queue: "example" },
  { task: "send_receipt", payload: { orderId: order, to: "ada@example.com" }, queue: "example" }, // again
  { task: "send_receipt", payload: { orderId: order + 1, to: "nobody" }, queue: "example" },
  { task: "flaky_report", queue: "example" },
]);
const ids = jobs.map((j) => /** @type {string} */ (j.jobId));

// Wait until every job has finished, one way or the other.
const deadline = Date.now() + 30_000;
for (;;) {
  const states = await Promise.all(ids.map(async (id) => (await idemq.getJob(id))?.state));
  if (states.every((s) => s === "succeeded" || s === "failed")) break;
  if (Date.now() > deadline) throw new Error(`jobs still running: ${states.join(", ")}`);
  await new Promise((resolve) => setTimeout(resolve, 50));
}

const { rows } = await idemq.pool.query(
  "SELECT order_id, amount FROM example_ledger WHERE order_id IN ($1, $2) ORDER BY order_id",
  [order, order + 1],
);
console.log(`\nledger rows: ${rows.length} (three credit deliveries for two orders)`);
console.log(`emails sent: ${[...sentEmails.keys()].filter((k) => k.includes(String(order))).length} (two receipt jobs for one order)`);

await worker.stop();
await idemq.close();
