// What the worker's shared state says of tracing in its types: no
// @opentelemetry/api type is named, so the declarations a project without
// the API type-checks against (dist/*.d.ts) never import it (as the metrics
// API does for prom-client, src/metrics/registry.ts).
import type { ClaimedJob } from "../sql/index.ts";

/** How an attempt ended, as its span's idemq.outcome says. */
export type AttemptOutcome = "succeeded" | "retry" | "failed" | "snoozed" | "cancelled" | "lease-lost" | "duplicate" | "released";

/** An attempt's span, as run-job tells it how the attempt ended. */
export interface AttemptTrace {
  /** The guard row says the effect was committed already: the handler does not run. */
  duplicate(): void;
  /** The attempt ended; `error` (a handler's, or why the lease was lost) marks the span as an error. The first call counts. */
  end(outcome: AttemptOutcome, error?: unknown): void;
}

/** Runs attempts in spans (spans.ts's AttemptTracing). */
export interface AttemptTracer {
  /** `trace` is undefined when no span is made (no SDK registered). */
  run(job: ClaimedJob, run: (trace: AttemptTrace | undefined) => Promise<void>): Promise<void>;
  /** Reads again whether spans are recorded (an SDK registered): once per claim batch. */
  refresh(): void;
  /** run() would only call its callback, with no trace (no SDK, no context manager), as of the latest refresh(). */
  readonly passesThrough: boolean;
}
