// The idemq group roles (docs/design.md, "Roles"): what each may call is
// defined once, in SQL (idemq._grant_roles); this module only names the roles,
// prints the script a DBA runs where the migrating role may not create roles,
// and grants a login role membership in one.
import pg from "pg";

export const ROLES = {
  producer: "idemq_producer",
  worker: "idemq_worker",
  admin: "idemq_admin",
} as const;
export type RoleKind = keyof typeof ROLES;
export type RoleName = (typeof ROLES)[RoleKind];

/**
 * The public functions idemq_producer and idemq_worker may call, besides the
 * constants active_states() and terminal_states() (idemq_admin: every
 * one), as idemq._grant_roles() grants them; for help texts.
 * test/contract/contract.test.ts holds these lists equal to the catalog's
 * grants.
 */
export const ROLE_FUNCTIONS = {
  producer: ["enqueue", "enqueue_many", "job"],
  worker: [
    "job",
    "claim",
    "complete",
    "complete_many",
    "fail",
    "heartbeat",
    "snooze",
    "guard",
    "effect_claim",
    "effect_done",
    "effect_release",
    "rescue",
    "wait_for_jobs",
    "stop_waiting",
    "prune_keys",
    "tick",
    "apply_retention",
    "worker_seen",
    "worker_stopped",
    "stats",
  ],
} as const satisfies Record<Exclude<RoleKind, "admin">, readonly string[]>;

/**
 * The script `idemq roles sql` prints: creates the three roles (NOLOGIN)
 * where missing, tolerating a concurrent creator, then, in a database that
 * has idemq installed, gives them their privileges. Run it as a role with
 * CREATEROLE (a superuser, or the admin role of a managed service) on each
 * database that has idemq; running it again changes nothing. Where idemq is
 * not installed yet, the migration grants them when it runs.
 */
export function rolesScript(): string {
  const names = Object.values(ROLES)
    .map((name) => `'${name}'`)
    .join(", ");
  return `-- idemq roles: run as a role with CREATEROLE, in each database that has idemq
-- (psql -v ON_ERROR_STOP=1 -f). Running it again changes nothing.
DO $$
DECLARE
  v_role text;
BEGIN
  FOREACH v_role IN ARRAY ARRAY[${names}] LOOP
    CONTINUE WHEN EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = v_role);
    BEGIN
      EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', v_role);
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
      NULL; -- a concurrent creator committed it first
    END;
  END LOOP;
END $$;

-- Their privileges (idemq._grant_roles, the one definition), where idemq is
-- installed; elsewhere \`idemq migrate\` grants them.
DO $$
BEGIN
  IF pg_catalog.to_regprocedure('idemq._grant_roles()') IS NOT NULL THEN
    PERFORM idemq._grant_roles();
  END IF;
END $$;
`;
}

/** Thrown by grantRole with the fix in its message; the CLI prints it as one line. */
export class RoleGrantError extends Error {
  override name = "RoleGrantError";
  constructor(
    message: string,
    readonly code: string,
  ) {
    super(message);
  }
}

/** GRANT idemq_<kind> TO member; returns whether member already had it. */
export async function grantRole(db: pg.ClientBase, member: string, kind: RoleKind): Promise<{ role: RoleName; alreadyMember: boolean }> {
  const role = ROLES[kind];
  const { rows } = await db.query<{ member_exists: boolean; role_exists: boolean; already: boolean | null }>(
    `SELECT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = $1) AS member_exists,
            EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = $2) AS role_exists,
            CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = $1)
                  AND EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = $2)
                 THEN pg_catalog.pg_has_role($1, $2, 'MEMBER') END AS already`,
    [member, role],
  );
  const found = rows[0]!;
  if (!found.role_exists) {
    throw new RoleGrantError(
      `role ${role} does not exist: create the idemq roles first (\`idemq roles sql\` prints the script; run it as a role with CREATEROLE)`,
      "42704",
    );
  }
  if (!found.member_exists) {
    throw new RoleGrantError(`role "${member}" does not exist: create the login role first, e.g. CREATE ROLE ${pg.escapeIdentifier(member)} LOGIN PASSWORD '...'`, "42704");
  }
  try {
    await db.query(`GRANT ${role} TO ${pg.escapeIdentifier(member)}`);
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code === "42501") {
      throw new RoleGrantError(
        `${(error as Error).message}: granting ${role} takes a superuser, or CREATEROLE (PostgreSQL 16 and later: with ADMIN OPTION on ${role})`,
        code,
      );
    }
    throw error;
  }
  return { role, alreadyMember: found.already === true };
}
