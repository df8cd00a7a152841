// What the metrics API says in its types: no prom-client type is named, so the
// declarations of a project without prom-client still type-check.

/** One line for a user who asked for metrics without prom-client installed. */
const PROM_CLIENT_MISSING =
  "metrics need the optional peer dependency prom-client, which is not installed: `npm install prom-client@15`";

/** prom-client is an optional peer dependency: its absence is one clear line, not a stack trace. */
export class MetricsUnavailableError extends Error {
  constructor(cause: unknown) {
    super(PROM_CLIENT_MISSING, { cause });
    this.name = "MetricsUnavailableError";
  }
}

/**
 * What idemq needs of a prom-client `Registry`. The declarations name no
 * prom-client type, so a project without it still type-checks; a Registry
 * of the application's own prom-client (the same copy: it is a peer) fits.
 */
export interface MetricsRegistry {
  /** The text exposition of every registered metric. */
  metrics(): Promise<string>;
  readonly contentType: string;
  getSingleMetric(name: string): unknown;
  removeSingleMetric(name: string): void;
}
