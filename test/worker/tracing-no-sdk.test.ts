// Tracing without a registered SDK (the default when @opentelemetry/api is
// installed but the application registers nothing): idemq makes no span per
// attempt or enqueue, stores and passes on the same contexts a no-op span
// would carry, and an SDK registered while the worker runs is honoured from
// its next claim on. A spy tracer provider, registered through the real API
// and then unregistered, counts the spans idemq asks for.
import { context, trace, type Attributes, type Context, type SpanOptions, type Tracer, type TracerProvider } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider } from "@opentelemetry/sdk-trace-base";
import { afterEach, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { unique } from "../helpers/jobs.ts";
import { startTestWorker, stopWorkers } from "../fixtures/worker/in-process.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

/** A tracer provider that records each startSpan's name and attributes, and makes real SDK spans. */
class SpyProvider implements TracerProvider {
  readonly started: { name: string; attributes: Attributes | undefined }[] = [];
  private readonly sdk = new BasicTracerProvider();

  getTracer(name: string, version?: string): Tracer {
    const real = this.sdk.getTracer(name, version);
    const started = this.started;
    return {
      startSpan(spanName: string, options?: SpanOptions, ctx?: Context) {
        started.push({ name: spanName, attributes: options?.attributes });
        return real.startSpan(spanName, options, ctx);
      },
      startActiveSpan: real.startActiveSpan.bind(real) as Tracer["startActiveSpan"],
    };
  }
}

const db = useTestDatabase({ poolSize: 4 });

afterEach(async () => {
  await stopWorkers();
  trace.disable();
  context.disable();
});

async function storedTraceparent(jobId: string): Promise<string | null> {
  return (await db.pool.query("SELECT traceparent FROM idemq.jobs WHERE id = $1", [jobId])).rows[0].traceparent;
}

describe("tracing without a registered SDK", () => {
  it("makes no span per attempt or enqueue once the SDK is unregistered, though the worker started with it", async () => {
    const spy = new SpyProvider();
    trace.setGlobalTracerProvider(spy);
    const queue = unique("unregistered");
    const client = new Client({ pool: db.pool });
    let ran = 0;
    const w = await startTestWorker(db.url, { t: async () => void ran++ }, { queues: [queue] });
    trace.disable(); // no SDK from here on
    const jobs = await client.enqueueMany(Array.from({ length: 20 }, () => ({ task: "t", queue })));
    const { jobId } = await client.enqueue("t", {}, { queue });
    await waitFor(() => w.of("job:success").length === 21, { what: "21 jobs to succeed" });
    expect(ran).toBe(21);
    expect(spy.started).toEqual([]);
    expect(await storedTraceparent(jobId)).toBeNull();
    expect(await storedTraceparent(jobs[0]!.jobId!)).toBeNull();
  });

  it("an SDK registered after the worker started gets the next attempts' spans, their attributes at startSpan", async () => {
    const queue = unique("late");
    const client = new Client({ pool: db.pool });
    const w = await startTestWorker(db.url, { t: async () => {} }, { queues: [queue] });
    const first = await client.enqueue("t", {}, { queue });
    await waitFor(() => w.of("job:success").some((e) => e.jobId === first.jobId), { what: "the first job to succeed" });

    const spy = new SpyProvider();
    trace.setGlobalTracerProvider(spy);
    const second = await client.enqueue("t", {}, { queue });
    await waitFor(() => w.of("job:success").some((e) => e.jobId === second.jobId), { what: "the second job to succeed" });
    expect(spy.started.map((s) => s.name)).toEqual([`enqueue ${queue}`, `process ${queue}`]);
    expect(spy.started[1]!.attributes).toMatchObject({
      "idemq.job_id": second.jobId,
      "idemq.task": "t",
      "idemq.attempt": 1,
      "idemq.reclaimed": false,
      "idemq.worker_id": w.worker.workerId,
    });
    expect(await storedTraceparent(second.jobId)).toMatch(/^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$/);
  });

  it("stores the context a no-op span would carry: the given traceparent, or the active span context's", async () => {
    context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
    const queue = unique("carried");
    const client = new Client({ pool: db.pool });
    const given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const explicit = await client.enqueue("t", {}, { queue, traceparent: given });
    expect(await storedTraceparent(explicit.jobId)).toBe(given);

    const active = { traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331", traceFlags: 1 };
    const inContext = await context.with(trace.setSpanContext(context.active(), active), () => client.enqueue("t", {}, { queue }));
    expect(await storedTraceparent(inContext.jobId)).toBe(`00-${active.traceId}-${active.spanId}-01`);

    // The handler runs in the producer's span context, as under a no-op span.
    let seen: string | undefined;
    const w = await startTestWorker(
      db.url,
      {
        t: async () => {
          seen ??= trace.getSpanContext(context.active())?.spanId;
        },
      },
      { queues: [queue], concurrency: 1 },
    );
    await waitFor(() => w.of("job:success").length === 2, { what: "both jobs to succeed" });
    expect(seen).toBe("00f067aa0ba902b7");
  });
});
