// The spans idemq makes when @opentelemetry/api is present: a PRODUCER span per
// enqueue call and a CONSUMER span per attempt of a job. Constructed only with
// the API loaded (otel-api.ts); without it callers hold null and skip all of this.
//
// The attempt span's parent is the enqueue span, read from the traceparent
// the job stored (claim() returns it), never the worker's active context: a
// job has nothing to do with whatever the worker loop was started in. The
// messaging conventions let a consumer that processes one message per span
// take the message's creation context as its parent (a link is required only
// for batches, where there is no single parent); an attempt is one job, so
// the producer's trace continues, each retry one more child span of the
// enqueue, as pg-boss does for a batch of one. Without a stored context the
// attempt span starts a trace of its own.
//
// Without a registered SDK every span is a no-op that only carries its
// parent's context: idemq then makes none (2 µs of worker CPU per job) and
// passes on that context itself, the same traceparent stored and the same
// context a handler runs in.
import type { Attributes, Context, Span, Tracer } from "@opentelemetry/api";
import type { EnqueueResult } from "../sql/index.ts";
import type { ClaimedJob } from "../sql/index.ts";
import { MESSAGING_SYSTEM, OPERATIONS, spanName, TRACE_ATTRIBUTES as A, TRACER_NAME } from "./attributes.ts";
import { sdkRegistered, type OtelApi } from "./otel-api.ts";
import { formatTraceparent, parseTraceparent } from "./traceparent.ts";
import type { AttemptOutcome, AttemptTrace, AttemptTracer } from "./types.ts";


function recordError(api: OtelApi, span: Span, error: unknown): void {
  span.setAttribute(A.errorType, error instanceof Error ? error.constructor.name : "_OTHER");
  if (error instanceof Error) span.recordException(error);
  span.setStatus({ code: api.SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
}

function baseAttributes(operation: keyof typeof OPERATIONS, queue: string | undefined): Attributes {
  const attributes: Attributes = {
    [A.system]: MESSAGING_SYSTEM,
    [A.operationName]: OPERATIONS[operation].name,
    [A.operationType]: OPERATIONS[operation].type,
  };
  if (queue !== undefined) {
    attributes[A.destination] = queue;
    attributes[A.queue] = queue;
  }
  return attributes;
}

/** The traceparent of the span context in `parent`, as a no-op span started there would carry it; undefined without a valid one. */
function parentTraceparent(api: OtelApi, parent: Context): string | undefined {
  const spanContext = api.trace.getSpanContext(parent);
  return spanContext === undefined ? undefined : formatTraceparent(api, spanContext);
}

/** An enqueue's row with the trace context stored on the job (enqueue's job_traceparent). */
export type TracedEnqueueResult = EnqueueResult & { jobTraceparent: string | null };

export class ProducerTracing {
  private readonly tracer: Tracer;

  constructor(private readonly api: OtelApi) {
    this.tracer = api.trace.getTracer(TRACER_NAME);
  }

  /**
   * Runs one enqueue in a PRODUCER span, a child of the active context (or of
   * `explicit`, a traceparent the caller passed), and hands `call` the
   * traceparent to store: the span's own, or `explicit` when the span is a
   * no-op (no SDK registered) or `explicit` does not parse (SQL then refuses
   * it with its 22023). A duplicate gets idemq.duplicate = true and a link to
   * the trace that created the job, when that job stored one.
   */
  async enqueue(
    task: string,
    queue: string | undefined,
    explicit: string | undefined,
    call: (traceparent: string | undefined) => Promise<TracedEnqueueResult>,
  ): Promise<TracedEnqueueResult> {
    const api = this.api;
    let parent = api.context.active();
    const given = parseTraceparent(api, explicit);
    if (given !== undefined) parent = api.trace.setSpanContext(parent, given);
    if (!sdkRegistered(api)) return call(explicit !== undefined && given === undefined ? explicit : (parentTraceparent(api, parent) ?? explicit));
    const span = this.tracer.startSpan(
      spanName("enqueue", queue),
      { kind: api.SpanKind.PRODUCER, attributes: { ...baseAttributes("enqueue", queue), [A.task]: task } },
      parent,
    );
    const traceparent = explicit !== undefined && given === undefined ? explicit : (formatTraceparent(api, span.spanContext()) ?? explicit);
    try {
      const row = await api.context.with(api.trace.setSpan(parent, span), () => call(traceparent));
      span.setAttributes({ [A.messageId]: row.jobId, [A.jobId]: row.jobId, [A.duplicate]: row.deduplicated });
      const existing = row.deduplicated ? parseTraceparent(api, row.jobTraceparent) : undefined;
      if (existing !== undefined) span.addLink({ context: existing });
      return row;
    } catch (error) {
      recordError(api, span, error);
      throw error;
    } finally {
      span.end();
    }
  }

  /**
   * Runs one enqueueMany in a PRODUCER span; `call` gets the span's
   * traceparent for every element that brings none of its own.
   */
  async enqueueMany<R extends { outcome: string }>(count: number, call: (traceparent: string | undefined) => Promise<R[]>): Promise<R[]> {
    const api = this.api;
    const parent = api.context.active();
    if (!sdkRegistered(api)) return call(parentTraceparent(api, parent));
    const span = this.tracer.startSpan(
      spanName("enqueue", undefined),
      { kind: api.SpanKind.PRODUCER, attributes: { ...baseAttributes("enqueue", undefined), [A.batchCount]: count } },
      parent,
    );
    try {
      const rows = await api.context.with(api.trace.setSpan(parent, span), () => call(formatTraceparent(api, span.spanContext())));
      span.setAttribute(A.duplicates, rows.filter((r) => r.outcome === "deduplicated").length);
      return rows;
    } catch (error) {
      recordError(api, span, error);
      throw error;
    } finally {
      span.end();
    }
  }
}

/** What run-job tells an attempt's span: how the attempt ended. */
class AttemptSpan implements AttemptTrace {
  private noted = false;

  constructor(
    private readonly api: OtelApi,
    private readonly span: Span,
  ) {}

  duplicate(): void {
    this.span.setAttribute(A.duplicate, true);
    this.end("duplicate");
  }

  end(outcome: AttemptOutcome, error?: unknown): void {
    if (this.noted) return;
    this.noted = true;
    this.span.setAttribute(A.outcome, outcome);
    if (error !== undefined) recordError(this.api, this.span, error);
  }

  /** The attempt's run rejected (a bug of the worker's, not a handler's error). */
  threw(error: unknown): void {
    if (!this.noted) recordError(this.api, this.span, error);
    this.noted = true;
  }
}

export class AttemptTracing implements AttemptTracer {
  private readonly tracer: Tracer;
  /** An SDK is registered (sdkRegistered), as of the latest refresh(). */
  private recording = false;
  /** A context manager is registered (context.with changes the active context), as of the latest refresh(). */
  private propagating = false;
  private readonly probe: Context;

  constructor(
    private readonly api: OtelApi,
    private readonly workerId: string,
  ) {
    this.tracer = api.trace.getTracer(TRACER_NAME);
    this.probe = api.ROOT_CONTEXT.setValue(Symbol("idemq context probe"), true);
    this.refresh();
  }

  /** Reads again whether an SDK and a context manager are registered: the worker calls it once per claim batch. */
  refresh(): void {
    const api = this.api;
    this.recording = sdkRegistered(api);
    this.propagating = !this.recording && api.context.with(this.probe, () => api.context.active() === this.probe);
  }

  /**
   * Neither an SDK nor a context manager is registered (as of the latest
   * refresh()): run() would only call its callback, with no trace. The
   * worker then runs the attempt itself, one async layer fewer per job.
   */
  get passesThrough(): boolean {
    return !this.recording && !this.propagating;
  }

  /**
   * Runs one attempt of `job` in a CONSUMER span whose parent is the
   * producer's stored context; `run` (the handler included) runs in the
   * span's context, so spans the handler makes are its children. Without an
   * SDK, no span: `run` gets no trace, and runs in the context the no-op span
   * would have given it (the producer's span context), when a context manager
   * can carry one.
   */
  run(job: ClaimedJob, run: (trace: AttemptTrace | undefined) => Promise<void>): Promise<void> {
    if (this.recording) return this.traced(job, run);
    if (!this.propagating) return run(undefined);
    const api = this.api;
    const producer = parseTraceparent(api, job.traceparent);
    const noop = api.trace.wrapSpanContext(producer ?? api.INVALID_SPAN_CONTEXT);
    return api.context.with(api.trace.setSpan(api.ROOT_CONTEXT, noop), () => run(undefined));
  }

  private async traced(job: ClaimedJob, run: (trace: AttemptTrace) => Promise<void>): Promise<void> {
    const api = this.api;
    const producer = parseTraceparent(api, job.traceparent);
    const parent = producer === undefined ? api.ROOT_CONTEXT : api.trace.setSpanContext(api.ROOT_CONTEXT, producer);
    const span = this.tracer.startSpan(
      spanName("process", job.queue),
      {
        kind: api.SpanKind.CONSUMER,
        attributes: {
          ...baseAttributes("process", job.queue),
          [A.task]: job.task,
          [A.messageId]: job.id,
          [A.jobId]: job.id,
          [A.attempt]: job.attempt,
          [A.reclaimed]: job.reclaimed,
          [A.duplicate]: false,
          [A.workerId]: this.workerId,
        },
      },
      parent,
    );
    const attempt = new AttemptSpan(api, span);
    try {
      await api.context.with(api.trace.setSpan(parent, span), () => run(attempt));
    } catch (error) {
      attempt.threw(error);
      throw error;
    } finally {
      span.end();
    }
  }
}
