// The worker's maintenance services, called directly through runOnce()
// (the timers only call these): rescue() hands back expired leases, and
// prune_keys() gets the worker's key retention, or no argument at all when
// none is configured, so the SQL default (14 days) applies.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Client, createWorker, type Worker } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";

const db = useTestDatabase({ poolSize: 3 });
let client: Client;
const workers: Worker[] = [];

beforeAll(async () => {
  client = new Client({ pool: db.pool });
});
afterAll(async () => {
  await Promise.all(workers.map((w) => w.stop()));
});

function worker(keyRetention?: string): Worker {
  const w = createWorker({
    pool: db.pool,
    handleSignals: false,
    tasks: { noop: async () => {} },
    ...(keyRetention === undefined ? {} : { keyRetention }),
  });
  workers.push(w);
  return w;
}

/** A succeeded job with this key, its key finished `ago` ago. */
async function finishedKey(key: string, ago: string, keyRetention?: string): Promise<void> {
  const { jobId } = await client.enqueue("noop", {}, {
    idempotencyKey: key,
    queue: "maintenance",
    ...(keyRetention === undefined ? {} : { keyRetention }),
  });
  await db.pool.query("SELECT idemq.claim(worker_id => 'w', queues => ARRAY['maintenance'])");
  await db.pool.query("SELECT idemq.complete(job_id => $1, attempt => 1, lease_token => (SELECT lease_token FROM idemq.jobs WHERE id = $1))", [jobId]);
  await db.pool.query("UPDATE idemq.keys SET finished_at = now() - $2::interval WHERE key = $1", [key, ago]);
}

async function keyExists(key: string): Promise<boolean> {
  return ((await db.pool.query("SELECT 1 FROM idemq.keys WHERE key = $1", [key])).rowCount ?? 0) === 1;
}

describe("rescuer.runOnce()", () => {
  it("calls rescue(): a job whose lease ran out goes back to enqueued", async () => {
    const { jobId } = await client.enqueue("noop", {}, { queue: "rescue-me" });
    await db.pool.query("SELECT idemq.claim(worker_id => 'crashed', queues => ARRAY['rescue-me'])");
    await db.pool.query("UPDATE idemq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", [jobId]);
    expect(await worker().rescuer.runOnce()).toBe(1);
    expect(await client.getJob(jobId)).toMatchObject({ state: "enqueued", attempt: 1, lockedBy: null });
    expect(await worker().rescuer.runOnce()).toBe(0);
  });
});

describe("keyPruner.runOnce()", () => {
  // ⚑ keyRetention is a floor over each key's own retention (enqueue's keyRetention).
  it("with keyRetention 1 hour: releases a key of 1-hour retention finished 2 hours ago, keeps one finished 30 minutes ago and one of the default retention", async () => {
    await finishedKey("retention:old", "2 hours", "1 hour");
    await finishedKey("retention:recent", "30 minutes", "1 hour");
    await finishedKey("retention:own-default", "2 hours");
    expect(await worker("1 hour").keyPruner.runOnce()).toBe(1);
    expect(await keyExists("retention:old")).toBe(false);
    expect(await keyExists("retention:recent")).toBe(true);
    expect(await keyExists("retention:own-default")).toBe(true);
  });

  it("without keyRetention the SQL default applies: a key finished 13 days ago stays, one finished 15 days ago goes", async () => {
    await finishedKey("default:13d", "13 days");
    await finishedKey("default:15d", "15 days");
    expect(await worker().keyPruner.runOnce()).toBe(1);
    expect(await keyExists("default:13d")).toBe(true);
    expect(await keyExists("default:15d")).toBe(false);
  });
});
