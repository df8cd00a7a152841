// Flow control in the database metrics (issue 26, item 8): idemq_paused and
// the limits' gauges, per scope, read from limits() at each scrape, and
// idemq_jobs_waiting, the enqueued jobs under why they wait (stats()).
import { describe, expect, it } from "vitest";
import { collectDatabaseMetrics } from "../../src/index.ts";
import { useTestDatabase } from "../helpers/db.ts";
import { enqueue, unique } from "../helpers/jobs.ts";
import { parsePrometheusText } from "../helpers/prometheus-text.ts";
import { claim } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 3 });

describe("collectDatabaseMetrics: flow control", () => {
  it("serves paused, concurrency, running, rate and started per scope, and drops a scope's series when it goes", async () => {
    const queue = unique("partner");
    const task = unique("charge");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 3, rate => 10, per => '1 minute')", [queue]);
    await db.pool.query("SELECT idemq.pause(task => $1)", [task]);
    for (let i = 0; i < 4; i++) await enqueue(db.pool, { queue });
    expect(await claim(db.pool, { queues: [queue], batch_size: 4 })).toHaveLength(3);

    const metrics = await collectDatabaseMetrics({ pool: db.pool });
    try {
      const series = async (): Promise<Record<string, string[]>> => {
        const families = parsePrometheusText(await metrics.registry.metrics());
        const out: Record<string, string[]> = {};
        for (const name of ["idemq_paused", "idemq_limit_concurrency", "idemq_limit_running", "idemq_limit_rate", "idemq_limit_started"]) {
          const family = families.get(name)!;
          expect(family.type, name).toBe("gauge");
          out[name] = family.samples.map((s) => `${s.labels.scope}:${s.labels.name}=${s.value}`).sort();
        }
        return out;
      };
      expect(await series()).toEqual({
        idemq_paused: [`queue:${queue}=0`, `task:${task}=1`],
        idemq_limit_concurrency: [`queue:${queue}=3`],
        idemq_limit_running: [`queue:${queue}=3`],
        idemq_limit_rate: [`queue:${queue}=10`],
        idemq_limit_started: [`queue:${queue}=3`],
      });

      // The one enqueued job left waits for a slot; the reasons it does not wait for are 0.
      const waiting = parsePrometheusText(await metrics.registry.metrics()).get("idemq_jobs_waiting")!;
      expect(waiting.type).toBe("gauge");
      expect(waiting.samples.filter((s) => s.labels.queue === queue).map((s) => `${s.labels.reason}=${s.value}`).sort()).toEqual([
        "concurrency=1",
        "held=0",
        "paused=0",
        "rate=0",
        "worker=0",
      ]);

      await db.pool.query("SELECT idemq.resume(task => $1)", [task]);
      await db.pool.query("SELECT idemq.clear_limit(queue => $1)", [queue]);
      const after = parsePrometheusText(await metrics.registry.metrics()).get("idemq_jobs_waiting")!;
      expect(after.samples.filter((s) => s.labels.queue === queue && s.value !== 0).map((s) => s.labels.reason)).toEqual(["worker"]);
      expect(await series()).toEqual({
        idemq_paused: [],
        idemq_limit_concurrency: [],
        idemq_limit_running: [],
        idemq_limit_rate: [],
        idemq_limit_started: [],
      });
    } finally {
      await metrics.close();
    }
  });
});
