// Type-level tests of typed tasks, checked by tsc, never run: by the
// project's `npm run typecheck`, and by test/types/tsconfig.json with the
// user-side flags exactOptionalPropertyTypes and
// noPropertyAccessFromIndexSignature (test/contract/typed-tasks.test.ts runs it). It
// imports "idemq" as an application would, so the same file can check the
// built declarations: see test/types/tsconfig.json.
import { Client, createWorker, defineTasks, type EnqueueManyJob, type Queryable, type TaskPayloads, type TasksFor } from "idemq";

declare const connectionString: string;

// ------------------------------------------------ payloads from the handlers

export const tasks = defineTasks({
  credit: {
    transactional: true,
    guardKey: (p) => `credit:${String(p.orderId)}`,
    run: async (p: { orderId: number; amount: number }, ctx) => {
      // A transactional task's ctx.tx is always there.
      await ctx.tx.query("INSERT INTO ledger (order_id, amount) VALUES ($1, $2)", [p.orderId, p.amount]);
    },
  },
  send_greeting: async (p: { name: string }, ctx) => {
    // @ts-expect-error a plain task has no transaction
    await ctx.tx.query("SELECT 1");
    return { greeted: p.name, attempt: ctx.job.attempt };
  },
  report: { maxAttempts: 3, run: async (p: { month: string; rows?: number }) => p.rows ?? 0 },
  ping: async () => "pong",
});

export const worker = createWorker({ connectionString, tasks });

const producer = new Client<typeof tasks>({ connectionString });

export async function produce(): Promise<void> {
  await producer.enqueue("credit", { orderId: 1, amount: 10 });
  await producer.enqueue("credit", { orderId: 1, amount: 10 }, { idempotencyKey: "credit:1", queue: "money" });
  await producer.enqueue("send_greeting", { name: "Ada" });
  await producer.enqueue("report", { month: "2026-11" });
  // A handler without a payload parameter: the payload may be left out.
  await producer.enqueue("ping");

  // @ts-expect-error unknown task name
  await producer.enqueue("credti", { orderId: 1, amount: 10 });
  // @ts-expect-error wrong payload type
  await producer.enqueue("credit", { orderId: "1", amount: 10 });
  // @ts-expect-error missing payload field
  await producer.enqueue("credit", { orderId: 1 });
  // @ts-expect-error missing payload
  await producer.enqueue("send_greeting");
  // @ts-expect-error a field the task does not take
  await producer.enqueue("send_greeting", { name: "Ada", nmae: "Ada" });

  await producer.enqueueMany([
    { task: "credit", payload: { orderId: 2, amount: 5 }, queue: "money" },
    { task: "send_greeting", payload: { name: "Grace" } },
    { task: "ping" },
  ]);
  // @ts-expect-error each element's payload is checked against its own task
  await producer.enqueueMany([{ task: "send_greeting", payload: { orderId: 2, amount: 5 } }]);
  // @ts-expect-error unknown task name in bulk
  await producer.enqueueMany([{ task: "nope", payload: {} }]);
  // @ts-expect-error missing payload in bulk
  await producer.enqueueMany([{ task: "credit" }]);

  const job: EnqueueManyJob<TaskPayloads<typeof tasks>> = { task: "report", payload: { month: "2026-12", rows: 3 } };
  await producer.enqueueMany([job]);

  // A schedule's task and payload are checked as enqueue's are.
  await producer.schedule({ name: "monthly", cron: "0 0 1 * *", task: "report", payload: { month: "2026-12" }, overlap: "queue_one" });
  await producer.schedule({ name: "ping", cron: "@every 30s", task: "ping" });
  // @ts-expect-error unknown task name in a schedule
  await producer.schedule({ name: "x", cron: "@daily", task: "nope" });
  // @ts-expect-error wrong payload type in a schedule
  await producer.schedule({ name: "x", cron: "@daily", task: "credit", payload: { orderId: "1", amount: 10 } });
  // @ts-expect-error an overlap policy that does not exist
  await producer.schedule({ name: "x", cron: "@daily", task: "ping", overlap: "sometimes" });
  // @ts-expect-error a misspelt option
  await producer.schedule({ name: "x", cron: "@daily", task: "ping", timeZone: "UTC" });
  const slots: Date[] | null = await producer.scheduleNext("monthly", { count: 3 });
  const checked: Date[] = await producer.scheduleNext({ cron: "0 9 * * MON-FRI", timezone: "Europe/Berlin", count: 5 });
  void slots;
  void checked;
}

// One task whose handler's ctx is unannotated: its type is still read from the handler.
const single = defineTasks({
  send_invoice: async (p: { orderId: number }, ctx) => ctx.log.info("sending", { orderId: p.orderId }),
});

export async function produceSingle(): Promise<void> {
  const client = new Client<typeof single>({ connectionString });
  await client.enqueue("send_invoice", { orderId: 42 });
  // @ts-expect-error wrong payload type
  await client.enqueue("send_invoice", { orderId: "42" });
  // @ts-expect-error unknown task name
  await client.enqueue("send_invoce", { orderId: 42 });
}

// ------------------------------------------------ payloads as a type argument

interface Payloads {
  credit: { orderId: number; amount: number };
  send_greeting: { name: string };
}

export const typedTasks = defineTasks<TasksFor<Payloads>>({
  credit: {
    transactional: true,
    // guardKey's parameter, run's parameters and ctx.job.payload are all typed.
    guardKey: (p) => `credit:${String(p.orderId)}`,
    run: async (p, ctx) => {
      const amount: number = ctx.job.payload.amount;
      await ctx.tx.query("INSERT INTO ledger (order_id, amount) VALUES ($1, $2)", [p.orderId, amount]);
    },
  },
  send_greeting: async (p, ctx) => {
    // @ts-expect-error ctx.job.payload is the task's payload type
    const wrong: number = ctx.job.payload.name;
    return { greeted: p.name, wrong };
  },
});

export async function produceFromPayloads(): Promise<void> {
  // The payload map alone types a producer (no handlers imported).
  const client = new Client<Payloads>({ connectionString });
  await client.enqueue("send_greeting", { name: "Ada" });
  // @ts-expect-error wrong payload type
  await client.enqueue("send_greeting", { name: 1 });
  // The same type from the tasks.
  const same = new Client<typeof typedTasks>({ connectionString });
  await same.enqueue("credit", { orderId: 3, amount: 1 });
  // @ts-expect-error missing payload field
  await same.enqueue("credit", { amount: 1 });
}

// ------------------------------------------------ an untyped Client, as before

export async function untyped(task: string, payload: unknown): Promise<void> {
  const client = new Client({ connectionString });
  await client.enqueue(task, payload);
  await client.enqueue("anything", { any: ["json"] }, { runAt: new Date() });
  await client.enqueue("no_payload");
  await client.enqueueMany([{ task, payload }, { task: "other" }]);
}

// ------------------------------------------------ options forwarded as they come

// With exactOptionalPropertyTypes, an option left undefined is accepted as unset.
export async function forwarding(
  queue: string | undefined,
  key: string | undefined,
  tx: Queryable | undefined,
  concurrency: number | undefined,
): Promise<void> {
  await producer.enqueue("ping", undefined, { queue, idempotencyKey: key, client: tx });
  await producer.enqueueMany([{ task: "ping", queue, idempotencyKey: key }], { client: tx });
  await producer.listJobs({ queue, limit: undefined });
  createWorker({ connectionString, tasks, concurrency, queues: undefined, poolConfig: undefined });
  new Client({ connectionString, poolConfig: undefined, onError: undefined });
}
