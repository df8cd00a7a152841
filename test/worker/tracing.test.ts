// OpenTelemetry traces (issue 14 item 3), with the real SDK and an in-memory
// exporter: an enqueue inside an active span makes a PRODUCER span and stores
// its traceparent on the job; a real worker runs the job in a CONSUMER span
// per attempt whose parent is that producer span (one trace), with the
// task, queue, attempt, reclaimed and duplicate attributes; a retry gives a
// second attempt span; a duplicate enqueue is marked and linked to the trace
// that created the job; and with tracing off nothing is stored or exported.
import { context, SpanKind, SpanStatusCode, trace, type Span } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from "@opentelemetry/sdk-trace-base";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { BadArgumentError, Client } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { claim, expireLease, rescue } from "../helpers/work.ts";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const appTracer = provider.getTracer("the-app");
const contextManager = new AsyncLocalStorageContextManager();

const db = useTestDatabase({ poolSize: 4 });
let client: Client;

beforeAll(async () => {
  context.setGlobalContextManager(contextManager.enable());
  trace.setGlobalTracerProvider(provider);
  client = new Client({ pool: db.pool });
});
afterEach(async () => {
  await stopWorkers();
});
afterAll(async () => {
  trace.disable();
  context.disable();
});

/** The spans of `kind` that idemq made for `queue`. */
function idemqSpans(kind: SpanKind, queue: string): ReadableSpan[] {
  return exporter
    .getFinishedSpans()
    .filter((s) => s.instrumentationScope.name === "idemq" && s.kind === kind && s.attributes["messaging.destination.name"] === queue);
}

async function storedTraceparent(jobId: string): Promise<string | null> {
  return (await db.pool.query("SELECT traceparent FROM idemq.jobs WHERE id = $1", [jobId])).rows[0].traceparent;
}

/** Runs `fn` inside an active span of the application, ended after it. */
async function inAppSpan<T>(name: string, fn: (span: Span) => Promise<T>): Promise<T> {
  return appTracer.startActiveSpan(name, async (span) => {
    try {
      return await fn(span);
    } finally {
      span.end();
    }
  });
}

describe("tracing: producer and attempt spans", () => {
  it("the attempt span's parent is the enqueue span, a child of the active span: one trace, with the job's attributes", async () => {
    const queue = unique("traced");
    let handlerSpanParent: string | undefined;
    const { jobId, request } = await inAppSpan("POST /orders", async (span) => {
      const { jobId } = await client.enqueue("send_receipt", { order: 1 }, { queue });
      return { jobId, request: span.spanContext() };
    });

    const [producer] = idemqSpans(SpanKind.PRODUCER, queue);
    expect(producer).toBeDefined();
    expect(producer!.name).toBe(`enqueue ${queue}`);
    expect(producer!.spanContext().traceId).toBe(request.traceId);
    expect(producer!.parentSpanContext?.spanId).toBe(request.spanId);
    expect(producer!.attributes).toMatchObject({
      "messaging.system": "idemq",
      "messaging.operation.type": "send",
      "idemq.task": "send_receipt",
      "idemq.queue": queue,
      "idemq.job_id": jobId,
      "idemq.duplicate": false,
    });
    // The job stores the producer span's context, as W3C formats it.
    expect(await storedTraceparent(jobId)).toBe(`00-${request.traceId}-${producer!.spanContext().spanId}-01`);

    const w = await startTestWorker(
      db.url,
      {
        send_receipt: async () => {
          // The handler runs in the attempt span's context: its spans are the attempt's children.
          const inner = appTracer.startSpan("render receipt");
          handlerSpanParent = (inner as unknown as ReadableSpan).parentSpanContext?.spanId;
          inner.end();
        },
      },
      { queues: [queue] },
    );
    await waitFor(() => w.of("job:success").some((e) => e.jobId === jobId), { what: "the traced job to succeed" });
    await waitFor(() => idemqSpans(SpanKind.CONSUMER, queue).length === 1, { what: "the attempt span to end" });

    const [attempt] = idemqSpans(SpanKind.CONSUMER, queue);
    expect(attempt!.name).toBe(`process ${queue}`);
    expect(attempt!.spanContext().traceId).toBe(request.traceId);
    expect(attempt!.parentSpanContext?.spanId).toBe(producer!.spanContext().spanId);
    expect(attempt!.parentSpanContext?.isRemote).toBe(true);
    expect(attempt!.attributes).toMatchObject({
      "messaging.system": "idemq",
      "messaging.operation.type": "process",
      "messaging.message.id": jobId,
      "idemq.task": "send_receipt",
      "idemq.queue": queue,
      "idemq.attempt": 1,
      "idemq.reclaimed": false,
      "idemq.duplicate": false,
      "idemq.outcome": "succeeded",
    });
    expect(attempt!.status.code).toBe(SpanStatusCode.UNSET);
    expect(handlerSpanParent).toBe(attempt!.spanContext().spanId);
  });

  it("a retried job gives one attempt span per attempt, both children of the enqueue span; the failed one records the error", async () => {
    const queue = unique("retried");
    const { jobId } = await inAppSpan("import", () => client.enqueue("flaky", {}, { queue }));
    const [producer] = idemqSpans(SpanKind.PRODUCER, queue);
    const w = await startTestWorker(
      db.url,
      {
        flaky: {
          backoff: { kind: "fixed", delays: ["50ms"] },
          run: async (_p, ctx) => {
            if (ctx.job.attempt === 1) throw new TypeError("supplier timed out");
          },
        },
      },
      { queues: [queue] },
    );
    await waitFor(() => w.of("job:success").some((e) => e.jobId === jobId), { what: "the retried job to succeed" });
    await waitFor(() => idemqSpans(SpanKind.CONSUMER, queue).length === 2, { what: "two attempt spans" });

    const attempts = idemqSpans(SpanKind.CONSUMER, queue).sort((a, b) => Number(a.attributes["idemq.attempt"]) - Number(b.attributes["idemq.attempt"]));
    expect(attempts.map((s) => s.attributes["idemq.attempt"])).toEqual([1, 2]);
    for (const s of attempts) {
      expect(s.spanContext().traceId).toBe(producer!.spanContext().traceId);
      expect(s.parentSpanContext?.spanId).toBe(producer!.spanContext().spanId);
    }
    expect(attempts[0]!.attributes).toMatchObject({ "idemq.outcome": "retry", "error.type": "TypeError" });
    expect(attempts[0]!.status).toEqual({ code: SpanStatusCode.ERROR, message: "supplier timed out" });
    expect(attempts[0]!.events.map((e) => e.name)).toContain("exception");
    expect(attempts[1]!.attributes["idemq.outcome"]).toBe("succeeded");
    expect(attempts[1]!.status.code).toBe(SpanStatusCode.UNSET);
  });

  it("a duplicate enqueue is marked duplicate and links to the trace that created the job, which keeps its context", async () => {
    const queue = unique("dup");
    const key = unique("key");
    const first = await inAppSpan("first request", () => client.enqueue("t", { a: 1 }, { queue, idempotencyKey: key }));
    const again = await inAppSpan("second request", () => client.enqueue("t", { a: 1 }, { queue, idempotencyKey: key }));
    expect(again).toEqual({ jobId: first.jobId, deduplicated: true });

    const producers = idemqSpans(SpanKind.PRODUCER, queue);
    expect(producers).toHaveLength(2);
    const [original, duplicate] = producers;
    expect(original!.attributes["idemq.duplicate"]).toBe(false);
    expect(duplicate!.attributes["idemq.duplicate"]).toBe(true);
    expect(duplicate!.spanContext().traceId).not.toBe(original!.spanContext().traceId);
    expect(duplicate!.links.map((l) => l.context.spanId)).toEqual([original!.spanContext().spanId]);
    expect(duplicate!.links[0]!.context.traceId).toBe(original!.spanContext().traceId);
    expect(await storedTraceparent(first.jobId)).toBe(`00-${original!.spanContext().traceId}-${original!.spanContext().spanId}-01`);
  });

  it("a transactional attempt whose guard finds the effect committed is marked duplicate", async () => {
    const queue = unique("guarded");
    await client.enqueue("credit", { order: 9 }, { queue });
    await client.enqueue("credit", { order: 9 }, { queue });
    const w = await startTestWorker(
      db.url,
      { credit: { transactional: true, guardKey: (p: { order: number }) => `credit:${queue}:${p.order}`, run: async () => {} } },
      { queues: [queue], concurrency: 1 },
    );
    await waitFor(() => w.of("job:duplicate").length === 1 && w.of("job:success").length === 1, { what: "one credit and one duplicate" });
    await waitFor(() => idemqSpans(SpanKind.CONSUMER, queue).length === 2, { what: "two attempt spans" });
    const byOutcome = Object.fromEntries(idemqSpans(SpanKind.CONSUMER, queue).map((s) => [s.attributes["idemq.outcome"], s.attributes["idemq.duplicate"]]));
    expect(byOutcome).toEqual({ succeeded: false, duplicate: true });
  });

  it("an attempt after a lost lease says reclaimed", async () => {
    const queue = unique("reclaimed");
    const { jobId } = await inAppSpan("request", () => client.enqueue("slow", {}, { queue }));
    // A first attempt whose worker vanished: claimed, its lease run out, rescued.
    const [lost] = await claim(db.pool, { queues: [queue] });
    expect(lost!.traceparent).toBe(await storedTraceparent(jobId));
    await expireLease(db.pool, jobId);
    expect(await rescue(db.pool)).toBeGreaterThanOrEqual(1);

    const w = await startTestWorker(db.url, { slow: async () => {} }, { queues: [queue] });
    await waitFor(() => w.of("job:success").some((e) => e.jobId === jobId), { what: "the reclaimed job to succeed" });
    await waitFor(() => idemqSpans(SpanKind.CONSUMER, queue).length === 1, { what: "the attempt span" });
    expect(idemqSpans(SpanKind.CONSUMER, queue)[0]!.attributes).toMatchObject({ "idemq.attempt": 2, "idemq.reclaimed": true });
  });

  it("enqueueMany runs in one producer span whose context every element stores", async () => {
    const queue = unique("bulk");
    const rows = await inAppSpan("bulk", () => client.enqueueMany([{ task: "t", queue }, { task: "t", queue }]));
    const [producer] = exporter
      .getFinishedSpans()
      .filter((s) => s.instrumentationScope.name === "idemq" && s.kind === SpanKind.PRODUCER && s.attributes["messaging.batch.message_count"] === 2);
    const expected = `00-${producer!.spanContext().traceId}-${producer!.spanContext().spanId}-01`;
    for (const row of rows) expect(await storedTraceparent(row.jobId!)).toBe(expected);
  });
});

describe("tracing: off, and bad input", () => {
  it("with tracing: false nothing is stored, no span is made, and the job runs", async () => {
    const queue = unique("untraced");
    const untraced = new Client({ pool: db.pool, tracing: false });
    const { jobId } = await inAppSpan("request", () => untraced.enqueue("t", {}, { queue }));
    expect(await storedTraceparent(jobId)).toBeNull();
    const w = await startTestWorker(db.url, { t: async () => {} }, { queues: [queue], tracing: false });
    await waitFor(() => w.of("job:success").some((e) => e.jobId === jobId), { what: "the untraced job to succeed" });
    expect(idemqSpans(SpanKind.PRODUCER, queue)).toEqual([]);
    expect(idemqSpans(SpanKind.CONSUMER, queue)).toEqual([]);
  });

  it("a job stored without a context gets an attempt span that starts its own trace", async () => {
    const queue = unique("rootless");
    const { jobId } = await new Client({ pool: db.pool, tracing: false }).enqueue("t", {}, { queue });
    const w = await startTestWorker(db.url, { t: async () => {} }, { queues: [queue] });
    await waitFor(() => w.of("job:success").some((e) => e.jobId === jobId), { what: "the job to succeed" });
    await waitFor(() => idemqSpans(SpanKind.CONSUMER, queue).length === 1, { what: "the attempt span" });
    expect(idemqSpans(SpanKind.CONSUMER, queue)[0]!.parentSpanContext).toBeUndefined();
  });

  it("a malformed traceparent given to enqueue is refused by SQL (22023, BadArgumentError) and nothing is enqueued", async () => {
    const queue = unique("bad");
    const error = await client.enqueue("t", {}, { queue, traceparent: "00-not-a-traceparent" }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BadArgumentError);
    expect(error).toMatchObject({ code: "22023" });
    expect((error as BadArgumentError).message).toMatch(/traceparent must be a W3C traceparent/);
    expect((await db.pool.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = $1", [queue])).rows[0].n).toBe(0);
    const [producer] = idemqSpans(SpanKind.PRODUCER, queue);
    expect(producer!.status.code).toBe(SpanStatusCode.ERROR);
  });

  it("a valid traceparent given to enqueue is the producer span's parent", async () => {
    const queue = unique("given");
    const given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const { jobId } = await client.enqueue("t", {}, { queue, traceparent: given });
    const [producer] = idemqSpans(SpanKind.PRODUCER, queue);
    expect(producer!.spanContext().traceId).toBe("4bf92f3577b34da6a3ce929d0e0e4736");
    expect(producer!.parentSpanContext?.spanId).toBe("00f067aa0ba902b7");
    expect(await storedTraceparent(jobId)).toBe(`00-4bf92f3577b34da6a3ce929d0e0e4736-${producer!.spanContext().spanId}-01`);
  });
});
