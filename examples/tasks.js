// @ts-check
// A tasks module for `idemq worker --tasks` (see the README, "Run a worker"):
//
//   npx idemq worker --tasks node_modules/idemq/examples/tasks.js   # in an app that installed idemq
//   npx idemq enqueue send_greeting '{"name": "Ada"}'               # in another terminal
//
// Plain JavaScript, so the CLI loads it without tsx; a TypeScript module
// (tasks.ts, typed with `import type { Tasks } from "idemq"`) looks the same
// and loads through your project's tsx. send_greeting is a plain task; credit
// is transactional: its ledger row, the guard row and complete() commit
// together, so a second delivery of the same order credits nothing.
//
// The worker runs as a login that is a member of this database's worker role
// and of no other idemq role (`npx idemq roles grant app_worker --worker`);
// credit creates its table, ledger, so that login also needs CREATE on a
// schema in its search_path (`GRANT CREATE ON SCHEMA public TO app_worker`:
// PostgreSQL 15 and later give PUBLIC none). test/contract/examples.test.ts
// runs it as such a login, with jobs enqueued by a producer login.

/** @type {import("idemq").Tasks} */
export const tasks = {
  send_greeting: async (payload, ctx) => {
    ctx.log.info("hello", { to: payload.name });
    return { greeted: payload.name };
  },
  credit: {
    transactional: true,
    guardKey: (payload) => `credit:order-${payload.orderId}`,
    run: async (payload, ctx) => {
      await ctx.tx.query("CREATE TABLE IF NOT EXISTS ledger (order_id int, amount int)");
      await ctx.tx.query("INSERT INTO ledger (order_id, amount) VALUES ($1, $2)", [payload.orderId, payload.amount]);
    },
  },
};
