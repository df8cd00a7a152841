// Whether a database has the idemq functions this version calls, by name and
// parameter names, read from the catalog. The worker checks at start(), so an
// unmigrated (or older) database fails there with the fix, instead of every
// claim failing later as a worker:error. Calls made without the check still
// map PostgreSQL's "does not exist" errors to SchemaMissingError (errors.ts).
import { SchemaMissingError } from "./errors.ts";
import { runQuery, SQL_FUNCTIONS, type Queryable } from "./sql-api.ts";

/** Resolves when every function of SQL_FUNCTIONS exists in schema idemq with its parameters; else throws SchemaMissingError. */
export async function checkSchema(db: Queryable): Promise<void> {
  const [row] = await runQuery<{ database: string; functions: Record<string, string[]> }>(
    db,
    `SELECT current_database() AS database,
            (SELECT coalesce(jsonb_object_agg(p.proname, coalesce(p.proargnames, '{}')), '{}')
               FROM pg_catalog.pg_proc p
               JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = 'idemq') AS functions`,
    [],
  );
  const { database, functions } = row!;
  const missing = Object.entries(SQL_FUNCTIONS)
    .filter(([name, params]) => {
      const found = functions[name];
      return found === undefined || params.some((param) => !found.includes(param));
    })
    .map(([name, params]) => `idemq.${name}(${params.join(", ")})`);
  if (missing.length === 0) return;
  const noSchema = Object.keys(functions).length === 0;
  throw new SchemaMissingError(database, {
    // As PostgreSQL would report the first call: no schema, or no such function.
    code: noSchema ? "3F000" : "42883",
    detail: noSchema ? 'schema "idemq" does not exist' : `missing: ${missing.join("; ")}`,
  });
}
