// The optional peer dependency @opentelemetry/api: the only place that imports
// it. Absent, tracing is off and costs nothing: no import, no span, and a
// caller's per-job price is one null check. Like prom-client
// (src/metrics/prom-client.ts), it is a peer so that the application and
// idemq share one copy: the API's global tracer provider lives in that copy.

export type OtelApi = typeof import("@opentelemetry/api");

let loading: Promise<OtelApi | null> | undefined;
let settled: OtelApi | null | undefined;

/**
 * Imports @opentelemetry/api once per process: the module, or null when it is
 * not installed. Any other failure (a broken install) rejects, once.
 */
export function loadOtelApi(): Promise<OtelApi | null> {
  loading ??= import("@opentelemetry/api").then(
    (module) => {
      // Named exports under ESM; under CommonJS interop they may sit on `default`.
      const m = module as OtelApi & { default?: OtelApi };
      settled = m.trace !== undefined ? m : m.default!;
      return settled;
    },
    (error: unknown) => {
      const code = (error as { code?: unknown } | null)?.code;
      if ((code === "ERR_MODULE_NOT_FOUND" || code === "MODULE_NOT_FOUND") && String(error).includes("@opentelemetry/api")) {
        settled = null;
        return null;
      }
      loading = undefined;
      throw error;
    },
  );
  return loading;
}

/** The API once loadOtelApi() has settled: the module, null (absent), or undefined (not settled yet). */
export function otelApiIfLoaded(): OtelApi | null | undefined {
  return settled;
}

/** What the global tracer provider delegates to when no SDK is registered (the API's no-op provider), once known. */
let noopProvider: unknown;

/**
 * An SDK (any tracer provider) is registered with the API's global tracer
 * provider now. Without one every span is a no-op, so idemq makes none: it
 * only carries the parent's context where a span would have. Read again
 * whenever it matters (per enqueue, per claim batch), so an SDK registered
 * later is honoured. A global provider from another copy of the API, which we
 * cannot look into, counts as registered (spans as before).
 */
export function sdkRegistered(api: OtelApi): boolean {
  const provider = api.trace.getTracerProvider();
  if (!(provider instanceof api.ProxyTracerProvider)) return true;
  noopProvider ??= new api.ProxyTracerProvider().getDelegate();
  return provider.getDelegate() !== noopProvider;
}
