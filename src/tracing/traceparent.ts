// The W3C traceparent (Trace Context, version 00) as idemq stores it in
// idemq.jobs.traceparent. SQL holds the rule of what may be stored
// (idemq._is_traceparent, the CHECK jobs_traceparent_w3c); this module writes
// values that meet it and reads the values claim() returns, which met it.
// Written from the span context directly rather than through the global
// propagator, so the column always holds this one format, whichever
// propagators the application registered (B3, Jaeger...).
import type { SpanContext } from "@opentelemetry/api";
import type { OtelApi } from "./otel-api.ts";

/** `00-<trace-id>-<span-id>-<flags>` for a valid span context; undefined for an invalid one (a no-op span's). */
export function formatTraceparent(api: OtelApi, context: SpanContext): string | undefined {
  if (!api.isSpanContextValid(context)) return undefined;
  return `00-${context.traceId}-${context.spanId}-${(context.traceFlags & 0xff).toString(16).padStart(2, "0")}`;
}

/** The remote span context a stored traceparent names; undefined for null or a value that is not one. */
export function parseTraceparent(api: OtelApi, value: string | null | undefined): SpanContext | undefined {
  if (typeof value !== "string") return undefined;
  const parts = value.split("-");
  if (parts.length !== 4 || parts[0] !== "00") return undefined;
  const context: SpanContext = { traceId: parts[1]!, spanId: parts[2]!, traceFlags: parseInt(parts[3]!, 16), isRemote: true };
  return api.isSpanContextValid(context) ? context : undefined;
}
