// The committed catalog snapshot (test/contract/catalog.snapshot.json): schema idemq's
// tables, columns, constraints, indexes, types, function signatures, views,
// triggers and sequences, read from pg_catalog through test/helpers/catalog.ts
// and made independent of the server it was read on: the owner's role name in
// ACLs becomes "<owner>", PostgreSQL 18's NOT NULL rows in pg_constraint are
// left out (columns carry not_null), and function bodies are left out (the
// drift test in test/contract/contract.test.ts compares them with sql/functions/).
// Written by scripts/catalog-snapshot.mjs; compared by test/contract/catalog-snapshot.test.ts.
import type pg from "pg";
import { catalogSnapshot, type CatalogSnapshot, roleNamesAsPlaceholders } from "./catalog.ts";

export const SNAPSHOT_PATH = new URL("../contract/catalog.snapshot.json", import.meta.url);
export const UPDATE_COMMAND = "node scripts/catalog-snapshot.mjs";

type Row = Record<string, unknown>;

export async function committedCatalog(db: pg.Pool | pg.ClientBase): Promise<CatalogSnapshot> {
  const snapshot = await catalogSnapshot(db);
  const { rows } = await db.query<{ owner: string }>(
    "SELECT pg_get_userbyid(n.nspowner) AS owner FROM pg_namespace n WHERE n.nspname = 'idemq'",
  );
  const named = roleNamesAsPlaceholders(snapshot, { owner: rows[0]?.owner ?? "" });
  return {
    ...named,
    constraints: (named.constraints as Row[]).filter((c) => c.type !== "n"),
    functions: (named.functions as Row[]).map(({ source: _source, ...f }) => f),
  };
}

/** The snapshot as written to disk: stable key order, two-space indent, final newline. */
export function serialize(snapshot: CatalogSnapshot): string {
  return `${JSON.stringify(snapshot, null, 2)}\n`;
}
