// serveMetrics(): GET /metrics over HTTP, in the text exposition format (the
// registry's content type). Loopback unless a host is given: exposing the
// figures beyond this machine is a choice the caller makes explicitly.
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { METRICS_DEFAULTS } from "./defaults.ts";
import type { MetricsRegistry } from "./registry.ts";

export interface MetricsServer {
  /** http://host:port/metrics, with the port bound (useful with port 0). */
  readonly url: string;
  readonly port: number;
  close(): Promise<void>;
}

export interface ServeMetricsOptions {
  /** 0 binds a free port (see `url`). */
  port: number;
  /** Default 127.0.0.1 (loopback). */
  host?: string;
}

/** Answers one request for the metrics (GET or HEAD): the same response on the metrics server and the dashboard. */
export function respondWithMetrics(registry: MetricsRegistry, req: IncomingMessage, res: ServerResponse): void {
  if (req.method !== "GET" && req.method !== "HEAD") {
    res.writeHead(405, { allow: "GET, HEAD", "content-type": "text/plain; charset=utf-8" }).end("use GET\n");
    return;
  }
  registry.metrics().then(
    (text) => res.writeHead(200, { "content-type": registry.contentType }).end(req.method === "HEAD" ? undefined : text),
    (error: unknown) =>
      res.writeHead(500, { "content-type": "text/plain; charset=utf-8" }).end(`metrics failed: ${error instanceof Error ? error.message : String(error)}\n`),
  );
}

/** Serves `registry` on GET /metrics; resolves once listening, rejects when the port cannot be bound. */
export async function serveMetrics(registry: MetricsRegistry, options: ServeMetricsOptions): Promise<MetricsServer> {
  const host = options.host ?? METRICS_DEFAULTS.host;
  const server = createServer((req, res) => {
    const path = (req.url ?? "").split("?")[0];
    if (path !== METRICS_DEFAULTS.path) {
      res.writeHead(404, { "content-type": "text/plain; charset=utf-8" }).end(`not found: the metrics are at ${METRICS_DEFAULTS.path}\n`);
      return;
    }
    respondWithMetrics(registry, req, res);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  const shownHost = host.includes(":") ? `[${host}]` : host;
  return {
    url: `http://${shownHost}:${port}${METRICS_DEFAULTS.path}`,
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
