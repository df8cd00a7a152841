// The package's migrations, read from sql/migrations, so tests that expect
// "everything applied" follow each new migration without an edit.
import { join } from "node:path";
import { DEFAULT_MIGRATIONS_DIR, packageMigrationNames } from "../../src/migrate.ts";

/** Every migration's name (file name without .sql), in the order they run (zero-padded numeric prefix). */
export const MIGRATION_NAMES: readonly string[] = packageMigrationNames();

/** The path of migration `name`. */
export function migrationPath(name: string): string {
  return join(DEFAULT_MIGRATIONS_DIR, `${name}.sql`);
}
