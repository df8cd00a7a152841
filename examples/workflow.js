// @ts-check
// A durable workflow (docs/worker.md, "Durable steps"): one job that reserves
// stock in the database, charges a card, waits for the shipment event, sleeps,
// then sends a review request, and resumes where it stopped after a crash, a
// sleep or a wait instead of doing any step twice. Run it like worker.js:
//
//   node examples/workflow.js     # DATABASE_URL, else the server of `npx idemq dev`
//
// It runs as a login in this database's producer and worker roles (emit is
// the producer's), with CREATE on a schema in its search_path for its table
// example_reservations; test/contract/examples.test.ts runs it so.
import { Client, createWorker } from "idemq";

const idemq = new Client();
await idemq.pool.query("CREATE TABLE IF NOT EXISTS example_reservations (order_id bigint NOT NULL, job_id bigint NOT NULL)");

// A stand-in for a payment API that honours idempotency keys.
/** @type {Map<string, { chargeId: string }>} */
const charges = new Map();
const payments = {
  /** @param {number} orderId @param {{ idempotencyKey: string }} opts */
  async charge(orderId, opts) {
    let answer = charges.get(opts.idempotencyKey);
    if (answer === undefined) {
      answer = { chargeId: `ch-${charges.size + 1}` };
      charges.set(opts.idempotencyKey, answer);
      console.log(`  [payments] charged order ${orderId}`);
    }
    return answer;
  },
};

let crashed = false;
const worker = createWorker({
  queues: ["example-workflow"],
  tasks: {
    fulfil_order: async (/** @type {{ orderId: number }} */ p, ctx) => {
      console.log(`attempt ${ctx.job.attempt}: runs from the top`);
      // Transactional: the insert commits with the step's record, once.
      await ctx.step("reserve", async (tx) => {
        await tx.query("INSERT INTO example_reservations (order_id, job_id) VALUES ($1, $2)", [p.orderId, ctx.job.id]);
        console.log("  step reserve ran");
        return null;
      });
      // External: claim first; the key is this job's and step's idempotency key.
      const charge = await ctx.step("charge", (key) => payments.charge(p.orderId, { idempotencyKey: key }), { external: true });
      if (!crashed) {
        crashed = true;
        throw new Error("the worker fell over after the charge");
      }
      // Parked (no slot held) until the shipment event; the payload is the step's result.
      const shipment = await ctx.waitFor("example.shipped", { key: String(p.orderId), timeout: "1 hour" });
      await ctx.sleep(300); // parked again, for 300 ms
      console.log(`  shipped by ${/** @type {{ carrier: string }} */ (shipment).carrier}; review request sent`);
      return { chargeId: charge.chargeId, shipment };
    },
  },
});
worker.on("job:retry", (e) => console.log(`retry      attempt ${e.attempt}: ${e.error.message}`));
worker.on("job:snoozed", (e) => console.log(`parked     attempt ${e.attempt}`));
worker.on("worker:error", ({ during, error }) => console.error(`worker error during ${during}: ${error.message}`));
await worker.start();

const orderId = Date.now();
const { jobId } = await idemq.enqueue("fulfil_order", { orderId }, { queue: "example-workflow", backoff: { kind: "fixed", delays: ["100ms"] } });

/** @param {(state: string | undefined) => boolean} done @param {string} what */
async function until(done, what) {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const job = await idemq.getJob(jobId);
    if (done(job?.state)) return job;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (job is ${job?.state})`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

// Once the job waits for its shipment (its step ledger says so: idemq.steps, the worker role's), the
// warehouse says it shipped, in its own transaction, as any SQL client may. Emitted earlier, the event
// would not be lost: the wait would find it.
for (const deadline = Date.now() + 30_000; ; ) {
  const { rows } = await idemq.pool.query("SELECT status FROM idemq.steps($1) WHERE name = 'wait:1'", [jobId]);
  if (rows[0]?.status === "waiting") break;
  if (Date.now() > deadline) throw new Error("timed out waiting for the job to wait for its shipment");
  await new Promise((resolve) => setTimeout(resolve, 50));
}
const woken = await idemq.emitEvent("example.shipped", { key: String(orderId), payload: { carrier: "ups" } });
console.log(`emitted    example.shipped (woke ${woken} job)`);
const job = await until((s) => s === "succeeded" || s === "failed", "the job to finish");

const { rows } = await idemq.pool.query("SELECT count(*)::int AS n FROM example_reservations WHERE order_id = $1", [orderId]);
console.log(`\n${job?.state}: result ${JSON.stringify(job?.result)}`);
console.log(`reservations: ${rows[0].n}, charges: ${charges.size} (one each, over ${job?.attempt} attempts)`);

await worker.stop();
await idemq.close();
