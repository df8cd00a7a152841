// The optional peer dependency prom-client: the only place that imports it,
// and the one line its absence gives. Nothing else in idemq loads it, so an
// install without it runs every command but the metrics ones.

import { MetricsUnavailableError, type MetricsRegistry } from "./registry.ts";

export type PromClient = typeof import("prom-client");

let loaded: Promise<PromClient> | undefined;

/** Imports prom-client once; a MetricsUnavailableError when it is not installed. */
export function loadPromClient(): Promise<PromClient> {
  loaded ??= import("prom-client").then(
    (module) => ((module as { default?: PromClient }).default ?? module) as PromClient,
    (error: unknown) => {
      loaded = undefined;
      const code = (error as { code?: unknown } | null)?.code;
      if ((code === "ERR_MODULE_NOT_FOUND" || code === "MODULE_NOT_FOUND") && String(error).includes("prom-client")) {
        throw new MetricsUnavailableError(error);
      }
      throw error;
    },
  );
  return loaded;
}

/** The registry given, or a new one (never prom-client's global default registry). */
export function registryOf(prom: PromClient, registry: MetricsRegistry | undefined): import("prom-client").Registry {
  return (registry as import("prom-client").Registry | undefined) ?? new prom.Registry();
}
