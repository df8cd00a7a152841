// Flow control (issue 26): set_limit, clear_limit, pause, resume, limits(),
// and claim() obeying them; slots freed by every way a job leaves processing.
// Each case uses its own queue or task (unique()), since these commit.
import { describe, expect, it } from "vitest";
import { expectSqlError, useTestDatabase } from "../helpers/db.ts";
import { makeJobs, unique } from "../helpers/jobs.ts";
import { claim, complete, expireLease, rescue } from "../helpers/work.ts";

const db = useTestDatabase({ poolSize: 4 });

interface LimitRow {
  queue: string | null;
  task: string | null;
  concurrency: number | null;
  rate: number | null;
  per: string | null;
  per_key: number | null;
  paused: boolean;
  running: number | null;
  started: number | null;
}

async function limitOf(scope: { queue?: string; task?: string }): Promise<LimitRow | undefined> {
  const { rows } = await db.pool.query<LimitRow>(
    "SELECT queue, task, concurrency, rate, per::text AS per, per_key, paused, running, started FROM idemq.limits() WHERE queue IS NOT DISTINCT FROM $1 AND task IS NOT DISTINCT FROM $2",
    [scope.queue ?? null, scope.task ?? null],
  );
  return rows[0];
}

async function flowRows(): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    "SELECT ((SELECT count(*) FROM idemq.limits) + (SELECT count(*) FROM idemq.limit_slots) + (SELECT count(*) FROM idemq.limit_releases) + (SELECT count(*) FROM idemq.limit_starts))::int AS n",
  );
  return rows[0]!.n;
}

const ids = (rows: { job_id: string }[]): string[] => rows.map((r) => r.job_id);

describe("set_limit: bad input", () => {
  const cases: [string, string, RegExp][] = [
    ["neither queue nor task", "SELECT idemq.set_limit(concurrency => 1)", /exactly one of queue and task, not neither/],
    ["both", "SELECT idemq.set_limit(queue => 'q', task => 't', concurrency => 1)", /not both/],
    ["empty task", "SELECT idemq.set_limit(task => '', concurrency => 1)", /must not be empty/],
    ["a queue name over 1000 characters", "SELECT idemq.set_limit(queue => repeat('q', 1001), concurrency => 1)", /over the limit of 1000/],
    ["a task name over task_bytes", "SELECT idemq.set_limit(task => repeat('t', 257), concurrency => 1)", /task_bytes/],
    ["no limit", "SELECT idemq.set_limit(queue => 'q')", /at least one limit/],
    ["concurrency 0", "SELECT idemq.set_limit(queue => 'q', concurrency => 0)", /concurrency must be between 1 and 10000, not 0/],
    ["negative concurrency", "SELECT idemq.set_limit(queue => 'q', concurrency => -3)", /not -3/],
    ["concurrency 10001", "SELECT idemq.set_limit(queue => 'q', concurrency => 10001)", /not 10001/],
    ["rate 0", "SELECT idemq.set_limit(queue => 'q', rate => 0, per => '1 minute')", /rate must be between/],
    ["rate without per", "SELECT idemq.set_limit(queue => 'q', rate => 10)", /got rate without per/],
    ["per without rate", "SELECT idemq.set_limit(queue => 'q', per => '1 minute')", /got per without rate/],
    ["per under a second", "SELECT idemq.set_limit(queue => 'q', rate => 1, per => '999 milliseconds')", /at least 1 second/],
    ["negative per", "SELECT idemq.set_limit(queue => 'q', rate => 1, per => '-1 minute')", /at least 1 second/],
    ["per over duration_days", "SELECT idemq.set_limit(queue => 'q', rate => 1, per => '36501 days')", /at most 36500 days/],
    ["per_key 0", "SELECT idemq.set_limit(queue => 'q', per_key => 0)", /per_key must be between/],
    ["clear_limit of both", "SELECT idemq.clear_limit(queue => 'q', task => 't')", /clear_limit: .*not both/],
    ["pause of neither", "SELECT idemq.pause()", /pause: .*not neither/],
    ["resume of an empty queue", "SELECT idemq.resume(queue => '')", /resume: the queue name must not be empty/],
  ];
  it.each(cases)("%s: 22023 with a HINT, nothing written", async (_name, statement, message) => {
    const before = await flowRows();
    const error = await expectSqlError(db.pool.query(statement), { code: "22023", message });
    expect(error.hint ?? "").not.toBe("");
    expect(await flowRows()).toBe(before);
  });

  it("a bad field leaves an existing limit as it was", async () => {
    const queue = unique("keep");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 2, rate => 5, per => '1 minute')", [queue]);
    await expectSqlError(db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 3, rate => 0, per => '1 minute')", [queue]), {
      code: "22023",
    });
    expect(await limitOf({ queue })).toMatchObject({ concurrency: 2, rate: 5, per: "00:01:00", running: 0, started: 0 });
  });
});

describe("set_limit, clear_limit, limits()", () => {
  it("set_limit replaces the fields it is given; clear_limit removes them; limits() lists each scope", async () => {
    const queue = unique("q");
    const task = unique("t");
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 3)", [queue]);
    await db.pool.query("SELECT idemq.set_limit(queue => $1, rate => 100, per => '1 minute', per_key => 2)", [queue]);
    await db.pool.query("SELECT idemq.set_limit(task => $1, concurrency => 1)", [task]);
    expect(await limitOf({ queue })).toEqual({
      queue, task: null, concurrency: 3, rate: 100, per: "00:01:00", per_key: 2, paused: false, running: 0, started: 0,
    });
    expect(await limitOf({ task })).toMatchObject({ queue: null, task, concurrency: 1, rate: null, started: null });
    // Concurrency 3: three stripes of one slot each (at most 8 stripes; _size_slots).
    const slots = await db.pool.query(
      "SELECT count(*)::int AS n, sum(s.size)::int AS size FROM idemq.limit_slots s JOIN idemq.limits l ON l.id = s.limit_id WHERE l.name = $1",
      [queue],
    );
    expect(slots.rows[0]).toEqual({ n: 3, size: 3 });
    expect((await db.pool.query("SELECT idemq.clear_limit(queue => $1) AS r", [queue])).rows[0].r).toBe(true);
    expect((await db.pool.query("SELECT idemq.clear_limit(queue => $1) AS r", [queue])).rows[0].r).toBe(false);
    expect(await limitOf({ queue })).toBeUndefined();
    const left = await db.pool.query("SELECT count(*)::int AS n FROM idemq.limit_slots s WHERE NOT EXISTS (SELECT FROM idemq.limits l WHERE l.id = s.limit_id)");
    expect(left.rows[0].n).toBe(0);
  });
});

describe("pause and resume", () => {
  it("a paused queue hands out nothing at once; running jobs finish; enqueue works; the pause survives a new session", async () => {
    const queue = unique("paused");
    const [first] = await makeJobs(db.pool, 3, { queue });
    const running = await claim(db.pool, { queues: [queue] });
    expect(ids(running)).toEqual([first]);
    expect((await db.pool.query("SELECT idemq.pause(queue => $1) AS r", [queue])).rows[0].r).toBe(true);
    expect((await db.pool.query("SELECT idemq.pause(queue => $1) AS r", [queue])).rows[0].r).toBe(false);
    expect(await claim(db.pool, { queues: [queue], batch_size: 10 })).toEqual([]);
    expect(await claim(db.pool, { batch_size: 1000 }).then((rows) => rows.filter((r) => r.queue === queue))).toEqual([]);
    await complete(db.pool, first!, 1);
    await makeJobs(db.pool, 1, { queue });
    const fresh = await db.newClient();
    try {
      expect(await claim(fresh, { queues: [queue], batch_size: 10 })).toEqual([]);
      expect(await limitOf({ queue })).toMatchObject({ paused: true, concurrency: null });
      expect((await fresh.query("SELECT idemq.resume(queue => $1) AS r", [queue])).rows[0].r).toBe(true);
      expect(await claim(fresh, { queues: [queue], batch_size: 10 })).toHaveLength(3);
      expect(await limitOf({ queue })).toBeUndefined();
      expect((await fresh.query("SELECT idemq.resume(queue => $1) AS r", [queue])).rows[0].r).toBe(false);
    } finally {
      await fresh.end();
    }
  });

  it("a paused task is held back in every queue, other tasks of its queue are not; a pause outlives clear_limit", async () => {
    const queue = unique("mixed");
    const task = unique("held");
    await makeJobs(db.pool, 2, { queue, task, priority: 5 });
    const [other] = await makeJobs(db.pool, 1, { queue, task: "test_task" });
    await db.pool.query("SELECT idemq.set_limit(task => $1, concurrency => 5), idemq.pause(task => $1)", [task]);
    await db.pool.query("SELECT idemq.clear_limit(task => $1)", [task]);
    expect(ids(await claim(db.pool, { queues: [queue], batch_size: 10 }))).toEqual([other]);
    expect(await claim(db.pool, { tasks: [task], batch_size: 10 })).toEqual([]);
    await db.pool.query("SELECT idemq.resume(task => $1)", [task]);
    expect(await claim(db.pool, { tasks: [task], batch_size: 10 })).toHaveLength(2);
  });
});

describe("concurrency", () => {
  it("at most N processing; each way out of processing frees the slot: complete, fail, snooze, rescue, cancel", async () => {
    const queue = unique("conc");
    await makeJobs(db.pool, 12, { queue, max_attempts: 5 });
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 2)", [queue]);
    const take = (): Promise<string[]> => claim(db.pool, { queues: [queue], batch_size: 10 }).then(ids);
    const held = async (): Promise<number> => (await limitOf({ queue }))!.running!;

    let running = await take();
    expect(running).toHaveLength(2);
    expect(await take()).toEqual([]);
    expect(await held()).toBe(2);

    await complete(db.pool, running[0]!, 1);
    expect(await held()).toBe(1);
    const afterComplete = await take();
    expect(afterComplete).toHaveLength(1);
    running = [running[1]!, afterComplete[0]!];

    await db.pool.query(`SELECT * FROM idemq.fail($1, 1, '{"message": "x"}', retry_at => now() + interval '1 hour')`, [running[0]]);
    expect(await held()).toBe(1);
    running = [running[1]!, ...(await take())];
    expect(running).toHaveLength(2);

    await db.pool.query("SELECT idemq.snooze($1, 1, now() + interval '1 hour')", [running[0]]);
    expect(await held()).toBe(1);
    running = [running[1]!, ...(await take())];
    expect(running).toHaveLength(2);

    await expireLease(db.pool, running[0]!);
    expect(await take(), "a lease that ran out still holds its slot until rescue").toEqual([]);
    expect(await rescue(db.pool)).toBeGreaterThanOrEqual(1);
    expect(await held()).toBe(1);
    running = [running[1]!, ...(await take())];
    expect(running).toHaveLength(2);

    await db.pool.query("SELECT idemq.cancel($1)", [running[0]]);
    expect(await held()).toBe(1);
    expect(await take()).toHaveLength(1);
    expect(await take()).toEqual([]);
    const { rows } = await db.pool.query("SELECT count(*)::int AS n FROM idemq.jobs WHERE queue = $1 AND state = 'processing'", [queue]);
    expect(rows[0].n).toBe(2);
  });

  it("a task limit and a queue limit both hold a job; a claim over several keys takes jobs in claim order while both have slots", async () => {
    const queue = unique("both");
    const task = unique("tk");
    await makeJobs(db.pool, 4, { queue, task, priority: 9 });
    await makeJobs(db.pool, 4, { queue, task: "test_task", priority: 1 });
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 3), idemq.set_limit(task => $2, concurrency => 1)", [queue, task]);
    const rows = await claim(db.pool, { queues: [queue], batch_size: 10 });
    expect(rows.map((r) => r.task)).toEqual([task, "test_task", "test_task"]);
    expect(await claim(db.pool, { queues: [queue], batch_size: 10 })).toEqual([]);
    await complete(db.pool, rows[1]!.job_id, 1);
    expect((await limitOf({ task }))!.running).toBe(1);
    expect((await claim(db.pool, { queues: [queue], batch_size: 10 })).map((r) => r.task)).toEqual(["test_task"]);
  });

  it("a new limit counts the jobs already processing; lowering it starts nothing until fewer than the new limit run", async () => {
    const queue = unique("lower");
    await makeJobs(db.pool, 10, { queue });
    const first = ids(await claim(db.pool, { queues: [queue], batch_size: 4 }));
    expect(first).toHaveLength(4);
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 5)", [queue]);
    expect((await limitOf({ queue }))!.running).toBe(4);
    const fifth = ids(await claim(db.pool, { queues: [queue], batch_size: 10 }));
    expect(fifth).toHaveLength(1);
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 2)", [queue]);
    const running = [...first, ...fifth];
    for (let i = 0; i < 3; i++) {
      await complete(db.pool, running[i]!, 1);
      expect(await claim(db.pool, { queues: [queue], batch_size: 10 }), `${4 - i} running, limit 2`).toEqual([]);
    }
    expect((await limitOf({ queue }))!.running).toBe(2);
    await complete(db.pool, running[3]!, 1);
    expect(await claim(db.pool, { queues: [queue], batch_size: 10 })).toHaveLength(1);
    // The claim folded the releases: the slots given up, the limit's slots are 2 again.
    const { rows } = await db.pool.query(
      "SELECT l.slot_rows, (SELECT sum(s.size)::int FROM idemq.limit_slots s WHERE s.limit_id = l.id) AS size FROM idemq.limits l WHERE l.name = $1",
      [queue],
    );
    expect(rows[0]).toEqual({ slot_rows: 2, size: 2 });
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 4)", [queue]);
    expect(await claim(db.pool, { queues: [queue], batch_size: 10 })).toHaveLength(2);
    expect((await limitOf({ queue }))!.running).toBe(4);
  });

  it("a crashed holder's slot comes back after rescue, and the job is reclaimed into it", async () => {
    const queue = unique("crash");
    await makeJobs(db.pool, 1, { queue });
    await db.pool.query("SELECT idemq.set_limit(queue => $1, concurrency => 1)", [queue]);
    const [job] = await claim(db.pool, { queues: [queue], worker_id: "doomed" });
    await expireLease(db.pool, job!.job_id);
    await rescue(db.pool);
    const again = await claim(db.pool, { queues: [queue], worker_id: "heir" });
    expect(again.map((r) => [r.job_id, r.attempt, r.reclaimed])).toEqual([[job!.job_id, 2, true]]);
    // One slot held, by the reclaimed attempt: the job names the stripe that holds it.
    const { rows } = await db.pool.query(
      `SELECT s.held FROM idemq.limit_slots s JOIN idemq.limits l ON l.id = s.limit_id
       JOIN idemq.jobs j ON j.queue = l.name AND j.queue_slot = s.slot
       WHERE l.name = $1 AND j.id = $2 AND j.attempt = 2 AND j.state = 'processing'`,
      [queue, job!.job_id],
    );
    expect(rows).toEqual([{ held: 1 }]);
    expect((await limitOf({ queue }))!.running).toBe(1);
  });
});

describe("rate", () => {
  it("no window of `per` holds more than `rate` starts, retries included, and a backlog runs near the rate", async () => {
    const queue = unique("rate");
    // The first three (priority 10) fail once and come back first: their retries are starts too.
    await makeJobs(db.pool, 3, { queue, max_attempts: 3, priority: 10 });
    await makeJobs(db.pool, 60, { queue, max_attempts: 3 });
    await db.pool.query("SELECT idemq.set_limit(queue => $1, rate => 4, per => '1 second')", [queue]);
    await db.pool.query("CREATE TABLE IF NOT EXISTS public.rate_starts (queue text, job_id bigint, attempt int, at timestamptz)");
    const client = await db.newClient();
    const started = Date.now();
    let retried = 0;
    try {
      while (Date.now() - started < 3000) {
        await client.query("BEGIN");
        const rows = await claim(client, { queues: [queue], batch_size: 3 });
        for (const r of rows) {
          await client.query("INSERT INTO public.rate_starts VALUES ($1, $2, $3, now())", [queue, r.job_id, r.attempt]);
        }
        await client.query("COMMIT");
        for (const r of rows) {
          if (r.attempt === 1 && retried < 3) {
            retried++;
            await client.query(`SELECT * FROM idemq.fail($1, 1, '{"message": "again"}', retry_at => now())`, [r.job_id]);
          } else {
            await complete(client, r.job_id, r.attempt);
          }
        }
      }
    } finally {
      await client.end();
    }
    const { rows } = await db.pool.query<{ n: number; worst: number; retries: number; span: number }>(
      `SELECT count(*)::int AS n,
              (SELECT max(w.n) FROM (SELECT (SELECT count(*) FROM public.rate_starts b WHERE b.queue = $1 AND b.at BETWEEN a.at - interval '1 second' AND a.at)::int AS n
                                     FROM public.rate_starts a WHERE a.queue = $1) w) AS worst,
              count(*) FILTER (WHERE attempt > 1)::int AS retries,
              extract(epoch FROM max(at) - min(at))::float8 AS span
         FROM public.rate_starts WHERE queue = $1`,
      [queue],
    );
    const r = rows[0]!;
    expect(r.worst, "starts in the worst closed window of 1 second").toBeLessThanOrEqual(4);
    expect(r.retries).toBe(3);
    // With a backlog every ring row is reused as soon as its second is up.
    expect(r.n).toBeGreaterThanOrEqual(Math.floor(0.9 * 4 * (Math.floor(r.span) + 1)));
    expect((await limitOf({ queue }))!.started).toBeLessThanOrEqual(4);
  });

  it("lowering a rate keeps the rows used last: a start after the change waits for a full period", async () => {
    const queue = unique("lower-rate");
    await makeJobs(db.pool, 10, { queue });
    await db.pool.query("SELECT idemq.set_limit(queue => $1, rate => 5, per => '1 hour')", [queue]);
    expect(await claim(db.pool, { queues: [queue], batch_size: 3 })).toHaveLength(3);
    await db.pool.query("SELECT idemq.set_limit(queue => $1, rate => 2, per => '1 hour')", [queue]);
    expect(await claim(db.pool, { queues: [queue], batch_size: 10 })).toEqual([]);
    await db.pool.query("SELECT idemq.set_limit(queue => $1, rate => 4, per => '1 hour')", [queue]);
    expect(await claim(db.pool, { queues: [queue], batch_size: 10 })).toHaveLength(2);
    expect((await limitOf({ queue }))!.started).toBe(4);
  });
});
