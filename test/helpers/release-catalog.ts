// A release's catalog in a form that can be committed and compared on any
// server: committedCatalog (owner-independent, the same on PostgreSQL 15 and
// 18) with each function's source, plus the rows the migrations write
// (settings and the rows kept from them), each object reduced to a digest of
// its description, keyed by its name. A difference names the objects that
// differ, and the fixture stays small though it covers every function body.
import { createHash } from "node:crypto";
import type pg from "pg";
import { committedCatalog } from "./catalog-snapshot.ts";
import { catalogSnapshot } from "./catalog.ts";

type Row = Record<string, unknown>;
export type CatalogDigest = Record<string, Record<string, string>>;

/** The tables whose rows a migration writes (not jobs' data): part of what a release installs. */
export const INSTALLED_ROWS = ["settings", "enqueue_limits", "success_retention", "retention"] as const;

/** Each catalog section's name for one of its rows (its object): what a difference is reported by. */
export const CATALOG_KEYS: Record<string, (row: Row) => string> = {
  relations: (r) => `${r.name}`,
  columns: (r) => `${r.relation}.${r.name}`,
  constraints: (r) => `${r.owner}.${r.name}`,
  indexes: (r) => `${r.table}.${r.name}`,
  types: (r) => `${r.name}`,
  functions: (r) => `${r.name}(${r.arguments})`,
  views: (r) => `${r.name}`,
  triggers: (r) => `${r.table}.${r.name}`,
  sequences: (r) => `${r.name}`,
};

export async function catalogDigest(db: pg.Pool | pg.ClientBase): Promise<CatalogDigest> {
  const committed = await committedCatalog(db);
  const sources = new Map(
    ((await catalogSnapshot(db)).functions as Row[]).map((f) => [CATALOG_KEYS.functions!(f), f.source]),
  );
  const digest: CatalogDigest = {};
  for (const [section, rows] of Object.entries(committed) as [string, Row[]][]) {
    const key = CATALOG_KEYS[section];
    if (key === undefined) throw new Error(`catalogDigest: no key for section ${section}`);
    digest[section] = Object.fromEntries(
      rows.map((row) => [key(row), hash(section === "functions" ? { ...row, source: sources.get(key(row)) } : row)]),
    );
  }
  digest.rows = {};
  for (const table of INSTALLED_ROWS) {
    const { rows } = await db.query(`SELECT * FROM idemq.${table} ORDER BY 1`);
    digest.rows[table] = hash(rows);
  }
  return digest;
}

function hash(value: unknown): string {
  return createHash("sha256").update(JSON.stringify(value)).digest("hex").slice(0, 16);
}
