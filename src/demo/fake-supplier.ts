// A local stand-in for a supplier's catalog API (HTTP on 127.0.0.1). Supplier
// "acme" is slow: its first `slowRequests` requests are never answered (the
// caller's timeout fires), later ones answer at once. Any other supplier does
// not exist: 404, an error no retry can fix.
import { createServer, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface FakeSupplier {
  /** Base URL; GET /suppliers/<name>/catalog. */
  url: string;
  /** Requests per supplier name. */
  requests: Map<string, number>;
  close(): Promise<void>;
}

export async function startFakeSupplier(options: { slowRequests: number }): Promise<FakeSupplier> {
  const supplier: FakeSupplier = {
    url: "",
    requests: new Map(),
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  const server = createServer((req, res) => {
    const match = /^\/suppliers\/([^/]+)\/catalog$/.exec(req.url ?? "");
    if (req.method !== "GET" || match === null) return answer(res, 404, { error: "GET /suppliers/<name>/catalog" });
    const name = decodeURIComponent(match[1]!);
    const count = (supplier.requests.get(name) ?? 0) + 1;
    supplier.requests.set(name, count);
    if (name !== "acme") return answer(res, 404, { error: `no supplier named ${name}` });
    // Hold the request open: the caller gives up after its timeout.
    if (count <= options.slowRequests) return;
    answer(res, 200, { supplier: name, products: 120 });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  supplier.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return supplier;
}

function answer(res: ServerResponse, status: number, body: unknown): void {
  if (res.destroyed) return;
  res.on("error", () => {});
  res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
}
