// `idemq worker` whose server goes away in the short window between its wait
// for the server and the worker's start (a restart, a failover) does not exit:
// it says so in one line, waits again, and starts once the server answers.
// A TCP proxy in front of the test database stands for the outage: it lets
// the CLI's first connections through (the wait and the schema check), then
// drops every new connection until the test heals it.
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { killAllWorkers, startWorker } from "../fixtures/worker/spawn.ts";
import { waitFor } from "../fixtures/worker/wait.ts";

const db = useTestDatabase({ poolSize: 2 });
let proxy: net.Server;
let sockets: net.Socket[] = [];
/** Connections accepted so far, and from which one on they are dropped (until healed). */
let accepted = 0;
let dropFrom = Number.POSITIVE_INFINITY;

beforeAll(async () => {
  const target = new URL(db.url);
  proxy = net.createServer((socket) => {
    accepted++;
    if (accepted >= dropFrom) {
      socket.destroy();
      return;
    }
    const upstream = net.connect(Number(target.port || 5432), target.hostname);
    sockets.push(socket, upstream);
    socket.pipe(upstream).pipe(socket);
    socket.on("error", () => upstream.destroy());
    upstream.on("error", () => socket.destroy());
  });
  await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
});
afterAll(async () => {
  await killAllWorkers();
  for (const socket of sockets) socket.destroy();
  sockets = [];
  await new Promise<void>((resolve) => proxy?.close(() => resolve()));
});

describe("a server lost while the worker starts", () => {
  it("the worker waits again instead of exiting, says so once, and runs jobs once the server answers", async () => {
    const address = proxy.address() as net.AddressInfo;
    const url = new URL(db.url);
    url.host = `127.0.0.1:${address.port}`;
    // The CLI's wait probe and its schema check get through; the worker's own connections do not.
    dropFrom = 3;
    const worker = startWorker({ tasks: "noop-tasks.ts", databaseUrl: url.toString(), env: { IDEMQ_TEST_POLL: "200ms" } });
    await waitFor(() => /idemq: the database went away while the worker started/.test(worker.stderr()), {
      what: "the worker's line about the lost server",
    });
    await waitFor(() => /idemq: waiting: /.test(worker.stderr()), { what: "the worker waiting for the server again" });
    expect(worker.child.exitCode).toBeNull();

    dropFrom = Number.POSITIVE_INFINITY; // the server is back
    await worker.waitForEvent((e) => e.event === "worker:started", "worker:started", 30_000);
    expect(worker.stderr().match(/went away while the worker started/g)).toHaveLength(1);
    expect(worker.stderr()).toMatch(/idemq: the database at 127\.0\.0\.1:\d+ answers\n/);
    const client = new Client({ pool: db.pool });
    const { jobId } = await client.enqueue("noop", {});
    await waitFor(async () => (await client.getJob(jobId))?.state === "succeeded", { what: "the job done" });
    worker.child.kill("SIGTERM");
    expect((await worker.exited).code).toBe(0);
  }, 60_000);
});
