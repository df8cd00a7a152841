// The demo's tasks, run by real worker processes:
//   node bin/idemq.js worker --tasks dist/demo/worker-tasks.js
// The demo passes its fake services' URLs and its short timings in IDEMQ_DEMO_*
// variables (see worker-processes.ts).
import type { ModuleWorkerOptions, Tasks, TransactionalJobContext } from "../worker/types.ts";
import { PermanentError } from "../errors.ts";
import type { Email, SendAnswer } from "./fake-email-provider.ts";

const env = (name: string): string | undefined => process.env[`IDEMQ_DEMO_${name}`];
const workerName = env("WORKER_NAME") ?? `worker-${process.pid}`;

/** Gives up on a supplier that does not answer in time: retryable. */
class SupplierTimeoutError extends Error {
  override name = "SupplierTimeoutError";
}

export interface CreditOrder {
  orderId: number;
  amount: number;
}

async function credit(task: string, p: CreditOrder, ctx: TransactionalJobContext): Promise<void> {
  await ctx.tx.query(
    "INSERT INTO demo.ledger (task, order_id, amount, job_id, attempt, worker) VALUES ($1, $2, $3, $4, $5, $6)",
    [task, p.orderId, p.amount, ctx.job.id, ctx.job.attempt, workerName],
  );
}

export const tasks: Tasks = {
  // Guarded: one ledger row per order, however often the job is delivered.
  credit: {
    transactional: true,
    guardKey: (p: CreditOrder) => `credit:order-${p.orderId}`,
    run: (p: CreditOrder, ctx) => credit("credit", p, ctx),
  },
  // The control: the same task without a guard key, one row per delivery.
  credit_unguarded: {
    transactional: true,
    run: (p: CreditOrder, ctx) => credit("credit_unguarded", p, ctx),
  },

  // An effect outside the database: claimed first, sent with the effect key as
  // the provider's Idempotency-Key, recorded after. A retry that finds the claim
  // of a dead attempt resends with the same key, and the provider replays.
  send_invoice: {
    backoff: { kind: "fixed", delays: ["250ms"] },
    run: (p: { invoice: string; customer: string }, ctx) =>
      ctx.effect(
        `invoice-email:${p.invoice}`,
        async (key): Promise<SendAnswer> => {
          const email: Email = { to: p.customer, subject: `Invoice ${p.invoice}` };
          const response = await fetch(`${env("EMAIL_URL")}/emails`, {
            method: "POST",
            headers: { "content-type": "application/json", "idempotency-key": key },
            body: JSON.stringify(email),
            signal: ctx.signal,
          });
          if (!response.ok) throw new Error(`email provider answered ${response.status}`);
          return (await response.json()) as SendAnswer;
        },
        { staleAfter: env("STALE_AFTER") ?? "1s" },
      ),
  },

  // Timeouts are retried on a fixed schedule; an unknown supplier is permanent.
  import_supplier: {
    maxAttempts: 5,
    backoff: { kind: "fixed", delays: ["200ms", "500ms"] },
    run: async (p: { supplier: string }, ctx) => {
      const timeoutMs = 500;
      let response: Response;
      try {
        response = await fetch(`${env("SUPPLIER_URL")}/suppliers/${encodeURIComponent(p.supplier)}/catalog`, {
          signal: AbortSignal.any([ctx.signal, AbortSignal.timeout(timeoutMs)]),
        });
      } catch (error) {
        if ((error as Error).name === "TimeoutError") {
          throw new SupplierTimeoutError(`supplier ${p.supplier} did not answer within ${timeoutMs} ms`);
        }
        throw error;
      }
      if (response.status === 404) throw new PermanentError(`supplier ${p.supplier} does not exist (404): a retry cannot fix that`);
      if (!response.ok) throw new Error(`supplier ${p.supplier} answered ${response.status}`);
      const catalog = (await response.json()) as { products: number };
      return { products: catalog.products };
    },
  },

  // For the duplicate policies: a payout fails for good on a bad amount.
  payout: {
    transactional: true,
    guardKey: (p: { orderId: number }) => `payout:order-${p.orderId}`,
    run: async (p: { orderId: number; amount: number }, ctx) => {
      if (!(p.amount > 0)) throw new PermanentError(`payout amount must be positive, got ${p.amount}`);
      await ctx.tx.query("INSERT INTO demo.payouts (order_id, amount, job_id) VALUES ($1, $2, $3)", [
        p.orderId,
        p.amount,
        ctx.job.id,
      ]);
    },
  },
};

export const workerOptions: ModuleWorkerOptions = {
  workerId: `${workerName}:${process.pid}`,
  ...(env("LEASE") === undefined ? {} : { lease: env("LEASE") }),
  ...(env("RESCUE") === undefined ? {} : { rescueInterval: env("RESCUE") }),
  ...(env("POLL") === undefined ? {} : { pollInterval: env("POLL") }),
  ...(env("PREFETCH") === undefined ? {} : { prefetch: Number(env("PREFETCH")) }),
  shutdownTimeout: "5s",
};

// The demo talks to its workers over an IPC channel only to notice its own
// death: a demo killed with SIGKILL must not leave its workers running.
if (typeof process.send === "function") process.on("disconnect", () => process.exit(1));
