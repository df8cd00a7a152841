// A description of one schema read from pg_catalog: tables and their columns,
// constraints, indexes, types, functions (with their source and privileges),
// views, triggers and sequences. Two databases built by different paths
// (migrate, psql script, up-down-up) must describe the same. Privileges are
// the ones in effect, sorted: a NULL ACL reads as its default, which a GRANT
// and REVOKE back leave spelled out.
import type pg from "pg";
import { installationRoles } from "../../src/roles.ts";

export interface CatalogSnapshot {
  relations: unknown[];
  columns: unknown[];
  constraints: unknown[];
  indexes: unknown[];
  types: unknown[];
  functions: unknown[];
  views: unknown[];
  triggers: unknown[];
  sequences: unknown[];
}

const QUERIES: Record<keyof CatalogSnapshot, string> = {
  relations: `
    -- PostgreSQL 17 added the MAINTAIN privilege (m), which an owner holds by default: left out, so the
    -- snapshot means the same on 15 and 18.
    SELECT c.relname AS name, c.relkind AS kind, (SELECT array_agg(regexp_replace(a::text, '=([^/]*)m([^/]*)/', '=\\1\\2/') ORDER BY a::text)
              FROM unnest(CASE WHEN c.relkind IN ('r', 'p', 'v', 'm', 'f') THEN coalesce(c.relacl, acldefault('r', c.relowner))
                               WHEN c.relkind = 'S' THEN coalesce(c.relacl, acldefault('s', c.relowner))
                               ELSE c.relacl END) a)::text AS acl,
           obj_description(c.oid, 'pg_class') AS comment
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = $1
     ORDER BY 1`,
  columns: `
    -- n_distinct: the planner's override of sampled statistics (jobs' task and queue, migration
    -- 0016); only those column options, as servers may keep others of their own there.
    -- position: the column's place among the live ones (a dropped column leaves a gap in attnum,
    -- so a Down that drops and an Up that re-adds a column would otherwise differ from a straight migrate).
    SELECT c.relname AS relation, row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum)::int AS position, a.attname AS name,
           format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null,
           pg_get_expr(d.adbin, d.adrelid) AS "default", a.attidentity AS identity,
           a.attgenerated AS generated, (SELECT array_agg(o ORDER BY o) FROM unnest(a.attoptions) o WHERE starts_with(o, 'n_distinct='))::text AS n_distinct, col_description(c.oid, a.attnum) AS comment
      FROM pg_class c
      JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
     WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'c', 'f')
     ORDER BY 1, 2`,
  constraints: `
    SELECT coalesce(c.relname, t.typname) AS owner, k.conname AS name, k.contype AS type,
           pg_get_constraintdef(k.oid) AS definition
      FROM pg_constraint k
      JOIN pg_namespace n ON n.oid = k.connamespace
      LEFT JOIN pg_class c ON c.oid = k.conrelid
      LEFT JOIN pg_type t ON t.oid = k.contypid
     WHERE n.nspname = $1
     ORDER BY 1, 2`,
  indexes: `
    SELECT tablename AS "table", indexname AS name, indexdef AS definition
      FROM pg_indexes WHERE schemaname = $1
     ORDER BY 1, 2`,
  types: `
    SELECT t.typname AS name, t.typtype AS kind,
           (SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid) AS labels,
           CASE WHEN t.typtype = 'd' THEN format_type(t.typbasetype, t.typtypmod) END AS base,
           t.typnotnull AS not_null, t.typdefault AS "default"
      FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
     WHERE n.nspname = $1 AND t.typtype IN ('e', 'd', 'c', 'r')
       AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c')
     ORDER BY 1`,
  functions: `
    SELECT p.proname AS name, pg_get_function_identity_arguments(p.oid) AS arguments,
           pg_get_function_arguments(p.oid) AS arguments_with_defaults,
           pg_get_function_result(p.oid) AS result, p.prokind AS kind, l.lanname AS language,
           p.provolatile AS volatility, p.proisstrict AS strict, p.prosecdef AS security_definer,
           p.proconfig AS config, (SELECT array_agg(a::text ORDER BY a::text) FROM unnest(coalesce(p.proacl, acldefault('f', p.proowner))) a)::text AS acl, p.prosrc AS source,
           obj_description(p.oid, 'pg_proc') AS comment
      FROM pg_proc p
      JOIN pg_namespace n ON n.oid = p.pronamespace
      JOIN pg_language l ON l.oid = p.prolang
     WHERE n.nspname = $1
     ORDER BY 1, 2`,
  views: `
    SELECT c.relname AS name, pg_get_viewdef(c.oid) AS definition
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = $1 AND c.relkind IN ('v', 'm')
     ORDER BY 1`,
  triggers: `
    SELECT c.relname AS "table", g.tgname AS name, pg_get_triggerdef(g.oid) AS definition
      FROM pg_trigger g
      JOIN pg_class c ON c.oid = g.tgrelid
      JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = $1 AND NOT g.tgisinternal
     ORDER BY 1, 2`,
  sequences: `
    SELECT c.relname AS name, format_type(s.seqtypid, NULL) AS type, s.seqstart AS start,
           s.seqincrement AS increment, s.seqmin AS min, s.seqmax AS max, s.seqcycle AS cycle
      FROM pg_sequence s
      JOIN pg_class c ON c.oid = s.seqrelid
      JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = $1
     ORDER BY 1`,
};

/**
 * Schema `schema` as pg_catalog describes it. Each installation has roles of
 * its own, named for its database (idemq.installation), so in privileges they
 * read as <producer>, <worker> and <admin>: two databases built by the same
 * path describe the same.
 */
export async function catalogSnapshot(db: pg.Pool | pg.ClientBase, schema = "idemq"): Promise<CatalogSnapshot> {
  const snapshot = {} as CatalogSnapshot;
  for (const [key, sql] of Object.entries(QUERIES) as [keyof CatalogSnapshot, string][]) {
    snapshot[key] = (await db.query(sql, [schema])).rows;
  }
  return roleNamesAsPlaceholders(snapshot, await installationRoleNames(db, schema));
}

/**
 * The snapshot with each role of `names` (placeholder -> role name) written
 * <placeholder> in the privileges of relations and functions: a role named
 * for one database, or an owner of one server, reads the same everywhere.
 */
export function roleNamesAsPlaceholders(snapshot: CatalogSnapshot, names: Record<string, string>): CatalogSnapshot {
  const acl = (value: unknown) =>
    typeof value === "string"
      ? Object.entries(names).reduce((text, [placeholder, name]) => text.replaceAll(new RegExp(`(?<=^\\{|,|=|/)${escapeRegExp(name)}(?=[=/,}])`, "g"), `<${placeholder}>`), value)
      : value;
  type Row = Record<string, unknown>;
  return {
    ...snapshot,
    relations: (snapshot.relations as Row[]).map((r) => ({ ...r, acl: acl(r.acl) })),
    functions: (snapshot.functions as Row[]).map((f) => ({ ...f, acl: acl(f.acl) })),
  };
}

/** The installation's role names by kind where schema idemq has them (0.2.0 on); none before. */
async function installationRoleNames(db: pg.Pool | pg.ClientBase, schema: string): Promise<Record<string, string>> {
  const { rows } = await db.query<{ found: boolean }>("SELECT to_regclass(format('%I.installation', $1::text)) IS NOT NULL AS found", [schema]);
  return schema === "idemq" && rows[0]?.found ? { ...(await installationRoles(db)) } : {};
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
