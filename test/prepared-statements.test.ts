// src/sql-api.ts calls the SQL functions as prepared statements (parsed and
// planned once per connection), unless IDEMQ_PREPARED_STATEMENTS=off, for
// poolers that cannot keep them (PgBouncer in transaction mode before 1.21).
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import type pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as sql from "../src/sql-api.ts";
import { freshDatabase, type TestDatabase } from "./helpers/db.ts";

let db: TestDatabase;
beforeAll(async () => {
  db = await freshDatabase();
});
afterAll(async () => {
  await db?.drop();
});

async function prepared(client: pg.Client): Promise<Array<{ name: string; statement: string }>> {
  const { rows } = await client.query<{ name: string; statement: string }>(
    "SELECT name, statement FROM pg_prepared_statements WHERE name LIKE 'idemq\\_%' ORDER BY name",
  );
  return rows;
}

describe("prepared statements", () => {
  it("by default each call text is prepared once per connection, under one name, and reused", async () => {
    const client = await db.newClient();
    await sql.enqueue(client, "prepared", { n: 1 });
    await sql.enqueue(client, "prepared", { n: 2 });
    await sql.enqueue(client, "prepared", { n: 3 }, { queue: "other" });
    const claimed = await sql.claim(client, { workerId: "w", batchSize: 3 });
    expect(claimed).toHaveLength(3);
    const statements = await prepared(client);
    // enqueue without and with a queue are two texts; claim is a third.
    expect(statements).toHaveLength(3);
    expect(statements.map((s) => s.statement).filter((t) => t.includes("idemq.enqueue("))).toHaveLength(2);
    expect(statements.some((s) => s.statement.includes("idemq.claim("))).toBe(true);
    expect(sql.PREPARED_STATEMENTS).toBe(true);
  });

  it("IDEMQ_PREPARED_STATEMENTS=off sends every call unnamed", () => {
    const script = `
      import pg from "pg";
      import * as sql from ${JSON.stringify(fileURLToPath(new URL("../src/sql-api.ts", import.meta.url)))};
      const client = new pg.Client({ connectionString: process.env.TEST_URL });
      await client.connect();
      await sql.enqueue(client, "unprepared", {});
      await sql.claim(client, { workerId: "w", batchSize: 1 });
      const { rows } = await client.query("SELECT count(*)::int AS n FROM pg_prepared_statements");
      console.log(JSON.stringify({ prepared: sql.PREPARED_STATEMENTS, statements: rows[0].n }));
      await client.end();
    `;
    const out = execFileSync(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], {
      env: { ...process.env, IDEMQ_PREPARED_STATEMENTS: "off", TEST_URL: db.url },
      encoding: "utf8",
    });
    expect(JSON.parse(out.trim())).toEqual({ prepared: false, statements: 0 });
  });
});
