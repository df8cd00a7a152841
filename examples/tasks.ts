// A tasks module for `idemq worker --tasks examples/tasks.ts` (see README).
// send_greeting is a plain task; credit is transactional: its ledger row, the
// guard row and complete() commit together, so a second delivery of the same
// order credits nothing.
import type { Tasks } from "../src/index.ts";

export const tasks: Tasks = {
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
