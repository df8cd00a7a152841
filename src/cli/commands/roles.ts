// idemq roles sql                         print the script that creates the idemq roles
// idemq roles grant ROLE --worker ...     make a login role a member of idemq roles
//
// The roles and what each may call: docs/design.md, "Roles". The migration
// creates them itself when the migrating role has CREATEROLE; otherwise a DBA
// runs the script `roles sql` prints.
import type { Command } from "commander";
import pg from "pg";
import { grantRole, ROLE_FUNCTIONS, type RoleKind, ROLES, rolesScript } from "../../roles.ts";
import { openDatabase } from "../connect.ts";
import { addExamples, type CommonOptions, databaseCommand } from "../define.ts";
import { action, emit, UsageError } from "../output.ts";

interface GrantOptions extends CommonOptions {
  producer?: boolean;
  worker?: boolean;
  admin?: boolean;
}

export function registerRolesCommands(program: Command): void {
  const roles = program
    .command("roles")
    .description("the idemq roles: idemq_producer (enqueue, read a job's outcome), idemq_worker (run jobs), idemq_admin (everything)");
  addExamples(roles, ["idemq roles sql > idemq-roles.sql", "idemq roles grant app_web --producer"]);

  roles
    .command("sql")
    .description("print the SQL that creates the idemq roles and grants their privileges (for a DBA: psql -v ON_ERROR_STOP=1 -f)")
    .addHelpText(
      "after",
      `
Run it as a role with CREATEROLE (a superuser, or a managed service's admin
role) in each database that has idemq; running it again changes nothing.
\`idemq migrate\` creates the roles itself when the migrating role may.

Examples:
  idemq roles sql > idemq-roles.sql && psql -v ON_ERROR_STOP=1 "$ADMIN_URL" -f idemq-roles.sql
`,
    )
    .action(() => {
      process.stdout.write(rolesScript());
    });

  const grant = roles
    .command("grant")
    .description("make login role ROLE a member of idemq roles (at least one of --producer, --worker, --admin)")
    .argument("<role>", "an existing login role, e.g. the one your workers connect as")
    .option("--producer", `grant ${ROLES.producer}: ${ROLE_FUNCTIONS.producer.join(", ")}`)
    .option("--worker", `grant ${ROLES.worker}: ${ROLE_FUNCTIONS.worker.join(", ")}`)
    .option("--admin", `grant ${ROLES.admin}: every function, and reading jobs`)
    .action(
      action(async (member: string, _options: GrantOptions, cmd: Command) => {
        const options = cmd.optsWithGlobals<GrantOptions>();
        const kinds = (Object.keys(ROLES) as RoleKind[]).filter((kind) => options[kind]);
        if (kinds.length === 0) throw new UsageError("say which role to grant: --producer, --worker or --admin (or several)");
        if (member.trim() === "") throw new UsageError("ROLE must not be empty: name the login role to grant");
        const db = await openDatabase({ databaseUrl: options.databaseUrl, json: options.json, requireSchema: false });
        const client = new pg.Client({ connectionString: db.url });
        client.on("error", () => {});
        try {
          await client.connect();
          const granted = [];
          for (const kind of kinds) granted.push(await grantRole(client, member, kind));
          emit(
            options,
            { role: member, granted: granted.map((g) => ({ role: g.role, alreadyMember: g.alreadyMember })) },
            granted.map((g) => (g.alreadyMember ? `${member} was already a member of ${g.role}.` : `Granted ${g.role} to ${member}.`)),
          );
        } finally {
          await client.end().catch(() => {});
          await db.close();
        }
      }),
    );
  databaseCommand(grant, [
    "idemq roles grant app_worker --worker",
    "idemq roles grant app_web --producer --json",
    "idemq roles grant ops --admin",
    "",
    "Roles are cluster-wide: the grant holds in every database of the server.",
    "It takes a superuser, or CREATEROLE (PostgreSQL 16 and later: with ADMIN OPTION on the idemq role).",
  ]);
}
