// The contract between the SQL, its files and the TypeScript mirror of it:
// TS constants equal the catalog's enums and state sets; the literal state
// lists the planner needs spelled out use real states; the error registry
// covers every SQLSTATE the SQL raises; the typed call module names every
// public function's parameters; defaults live once; the installed functions
// match sql/functions/ (drift) and the latest migration state equals
// sql/functions/; every function file carries its header (signature, purpose,
// Guarantees, Concurrency, Errors, Tests); PUBLIC executes nothing, and every
// function pins search_path (or is bound at CREATE).
import { execFile } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import {
  ACTIVE_STATES,
  BACKOFF_FIELDS,
  BACKOFF_KINDS,
  DUPLICATE_POLICIES,
  ERROR_CODES,
  JOB_STATES,
  SCHEDULE_MISFIRES,
  SCHEDULE_OVERLAPS,
  SCHEDULE_SQL_DEFAULTS,
  SCOPE_WAITING_REASONS,
  TERMINAL_STATES,
  WAITING_REASONS,
} from "../../src/contract.ts";
import { BadArgumentError, DETAIL_FIELDS, DETAIL_SUBCLASSES, ERROR_CLASSES } from "../../src/errors.ts";
import { SCHEDULE_PARAMETERS, SQL_FUNCTIONS } from "../../src/sql/index.ts";
import { installationRoles, ROLE_FUNCTIONS } from "../../src/roles.ts";
import { duplicateNames, functionPaths } from "../../scripts/migration-new.mjs";
import { useTestDatabase, inRollback } from "../helpers/db.ts";
import { splitSqlList } from "../helpers/split-sql-list.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");
const FUNCTIONS_DIR = join(ROOT, "sql", "functions");
const run = promisify(execFile);

const db = useTestDatabase({ poolSize: 4 });

async function list(sql: string): Promise<string[]> {
  const { rows } = await db.pool.query<{ v: string[] }>(`SELECT (${sql})::text[] AS v`);
  return rows[0]!.v;
}

// sql/functions/FAMILY/NAME.sql, by name; path: relative to sql/functions/.
const functionFiles = functionPaths(FUNCTIONS_DIR).map((f) => ({
  name: f.name,
  path: f.file,
  file: join(FUNCTIONS_DIR, f.file),
  text: readFileSync(join(FUNCTIONS_DIR, f.file), "utf8"),
}));

async function installedFunctions(): Promise<Array<{ name: string; oid: number }>> {
  const { rows } = await db.pool.query<{ name: string; oid: number }>(
    "SELECT p.proname AS name, p.oid::int AS oid FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace ORDER BY 1",
  );
  return rows;
}

describe("TypeScript constants equal the catalog", () => {
  it("JOB_STATES equals enum_range(NULL::idemq.job_state), in order", async () => {
    expect(await list("enum_range(NULL::idemq.job_state)")).toEqual([...JOB_STATES]);
  });

  it("ACTIVE_STATES equals idemq.active_states(), TERMINAL_STATES equals idemq.terminal_states()", async () => {
    expect(await list("idemq.active_states()")).toEqual([...ACTIVE_STATES]);
    expect(await list("idemq.terminal_states()")).toEqual([...TERMINAL_STATES]);
  });

  it("active_states() and terminal_states() partition the enum", async () => {
    const all = await list("enum_range(NULL::idemq.job_state)");
    const active = await list("idemq.active_states()");
    const terminal = await list("idemq.terminal_states()");
    expect(active.filter((s) => terminal.includes(s))).toEqual([]);
    expect([...active, ...terminal].sort()).toEqual([...all].sort());
  });

  it("WAITING_REASONS equals enum_range(NULL::idemq.waiting_reason), in order; SCOPE_WAITING_REASONS are the values _scope_waits() may say, in order", async () => {
    expect(await list("enum_range(NULL::idemq.waiting_reason)")).toEqual([...WAITING_REASONS]);
    const { rows } = await db.pool.query<{ body: string }>("SELECT prosrc AS body FROM pg_proc WHERE oid = 'idemq._scope_waits'::regproc");
    const said = [...rows[0]!.body.matchAll(/THEN '(\w+)'/g)].map((m) => m[1]);
    expect(said).toEqual([...SCOPE_WAITING_REASONS]);
    expect(WAITING_REASONS.slice(-SCOPE_WAITING_REASONS.length)).toEqual([...SCOPE_WAITING_REASONS]);
  });

  it("DUPLICATE_POLICIES equals enum_range(NULL::idemq.duplicate_policy), in order, the first being enqueue's default", async () => {
    expect(await list("enum_range(NULL::idemq.duplicate_policy)")).toEqual([...DUPLICATE_POLICIES]);
    const { rows } = await db.pool.query("SELECT pg_get_function_arguments('idemq.enqueue'::regproc) AS args");
    expect(rows[0].args).toContain(`duplicate_policy idemq.duplicate_policy DEFAULT '${DUPLICATE_POLICIES[0]}'`);
  });

  it("SCHEDULE_OVERLAPS and SCHEDULE_MISFIRES equal enum_range of idemq.schedule_overlap and idemq.schedule_misfire, in order, the first being schedule()'s default", async () => {
    expect(await list("enum_range(NULL::idemq.schedule_overlap)")).toEqual([...SCHEDULE_OVERLAPS]);
    expect(await list("enum_range(NULL::idemq.schedule_misfire)")).toEqual([...SCHEDULE_MISFIRES]);
    const { rows } = await db.pool.query("SELECT pg_get_function_arguments('idemq.schedule'::regproc) AS args");
    expect(rows[0].args).toContain(`overlap idemq.schedule_overlap DEFAULT '${SCHEDULE_OVERLAPS[0]}'`);
    expect(rows[0].args).toContain(`misfire idemq.schedule_misfire DEFAULT '${SCHEDULE_MISFIRES[0]}'`);
  });

  it("BACKOFF_KINDS and BACKOFF_FIELDS equal the kinds and fields idemq._backoff_problem accepts", async () => {
    // _backoff_problem names the fields of a kind when it refuses another one.
    const { rows } = await db.pool.query<{ kind: string; problem: string | null }>(
      `SELECT k AS kind, idemq._backoff_problem(jsonb_build_object('kind', k, 'no_such_field', 1)) AS problem
       FROM unnest($1::text[]) k`,
      [[...BACKOFF_KINDS, "linear"]],
    );
    const fields = Object.fromEntries(rows.map((r) => [r.kind, /\(fields: ([^)]*)\)/.exec(r.problem ?? "")?.[1]?.split(", ") ?? null]));
    expect(fields).toEqual({ ...BACKOFF_FIELDS, linear: null });
    expect(rows.find((r) => r.kind === "linear")!.problem).toMatch(/^backoff kind must be "polynomial", "exponential" or "fixed"/);
  });
});

describe("literal state lists in the schema", () => {
  // A state is spelt as 'name'::idemq.job_state, or inside an array constant '{a,b}'::idemq.job_state[].
  const literals = (definition: string) => [
    ...[...definition.matchAll(/'(\w+)'::idemq\.job_state\b(?!\[)/g)].map((m) => m[1]!),
    ...[...definition.matchAll(/'\{([\w,]+)\}'::idemq\.job_state\[\]/g)].flatMap((m) => m[1]!.split(",")),
  ];

  async function definitions(): Promise<Array<{ kind: string; name: string; def: string }>> {
    const { rows } = await db.pool.query<{ kind: string; name: string; def: string }>(`
      SELECT 'constraint' AS kind, k.conname AS name, pg_get_constraintdef(k.oid) AS def
        FROM pg_constraint k WHERE k.connamespace = 'idemq'::regnamespace
      UNION ALL
      SELECT 'index', i.indexname, i.indexdef FROM pg_indexes i WHERE i.schemaname = 'idemq'
      UNION ALL
      SELECT 'trigger', t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
       WHERE c.relnamespace = 'idemq'::regnamespace AND NOT t.tgisinternal
      ORDER BY 1, 2`);
    return rows;
  }

  it("constraints, partial-index predicates and trigger conditions name only real states", async () => {
    const states = await list("enum_range(NULL::idemq.job_state)");
    const defs = await definitions();
    const withStates = defs.filter((d) => literals(d.def).length > 0);
    expect(withStates.length).toBeGreaterThanOrEqual(5);
    for (const d of withStates) {
      for (const s of literals(d.def)) expect(states, `${d.kind} ${d.name}: '${s}'`).toContain(s);
    }
  });

  it("every terminal list (jobs_finished_iff_terminal, keys_finished_state_terminal, retention_state_terminal, trigger jobs_finished) equals terminal_states()", async () => {
    const terminal = [...(await list("idemq.terminal_states()"))].sort();
    const defs = await definitions();
    const byName = (name: string) => defs.find((d) => d.name === name)!.def;
    expect([...literals(byName("jobs_finished_iff_terminal"))].sort()).toEqual(terminal);
    expect([...literals(byName("keys_finished_state_terminal"))].sort()).toEqual(terminal);
    expect([...literals(byName("retention_state_terminal"))].sort()).toEqual(terminal);
    // The trigger's WHEN holds two lists: NEW.state in terminal, OLD.state not in terminal.
    const trigger = literals(byName("jobs_finished"));
    expect(trigger).toHaveLength(terminal.length * 2);
    expect([...trigger.slice(0, terminal.length)].sort()).toEqual(terminal);
    expect([...trigger.slice(terminal.length)].sort()).toEqual(terminal);
  });

  it("partial indexes cover active states only: jobs_runnable_by_task_queue {enqueued, scheduled}, jobs_leases {processing}, jobs_deadlines the waiting states", async () => {
    const active = await list("idemq.active_states()");
    const defs = await definitions();
    const byName = (name: string) => literals(defs.find((d) => d.name === name)!.def).sort();
    expect(byName("jobs_runnable_by_task_queue")).toEqual(["enqueued", "scheduled"]);
    expect(byName("jobs_leases")).toEqual(["processing"]);
    expect(byName("jobs_deadlines")).toEqual(active.filter((s) => s !== "processing").sort());
  });

  it("state literals compared with a state in the function files are real states", async () => {
    const states = await list("enum_range(NULL::idemq.job_state)");
    let checked = 0;
    for (const f of functionFiles) {
      const body = f.text.replace(/^--.*$/gm, "");
      for (const m of body.matchAll(/\bstate\s+(?:NOT\s+)?IN\s*\(([^)]*)\)/gi)) {
        for (const lit of m[1]!.matchAll(/'(\w+)'/g)) {
          expect(states, `${f.name}.sql: ${m[0]}`).toContain(lit[1]);
          checked++;
        }
      }
      for (const m of body.matchAll(/\bstate\s*(?:=|<>)\s*'(\w+)'/gi)) {
        expect(states, `${f.name}.sql: ${m[0]}`).toContain(m[1]);
        checked++;
      }
    }
    expect(checked).toBeGreaterThan(10);
  });
});

describe("error registry", () => {
  const raised = new Map<string, string[]>();
  for (const f of functionFiles) {
    for (const m of f.text.matchAll(/'(IQ[0-9A-Z]{3})'/g)) raised.set(m[1]!, [...(raised.get(m[1]!) ?? []), f.name]);
  }

  it("ERROR_CLASSES has a class for every IQ SQLSTATE raised in sql/functions/", () => {
    const missing = [...raised.keys()].filter((code) => !(code in ERROR_CLASSES));
    expect(missing, "codes raised in SQL without a TS class").toEqual([]);
    expect(raised.size).toBeGreaterThanOrEqual(5);
  });

  it("every code of ERROR_CLASSES is raised by some SQL function, except IQ400, the client-side BadArgumentError code", () => {
    const unraised = Object.keys(ERROR_CLASSES).filter((code) => !raised.has(code));
    // The SQL reports bad arguments with PostgreSQL's class 22 (mapped to
    // BadArgumentError by class); IQ400 is what client-side checks carry.
    expect(unraised).toEqual(["IQ400"]);
    expect(BadArgumentError.defaultCode).toBe("IQ400");
  });

  it("ERROR_CODES (the documented table) and ERROR_CLASSES name the same codes", () => {
    expect(Object.keys(ERROR_CODES).sort()).toEqual(Object.keys(ERROR_CLASSES).sort());
  });

  it("DETAIL_FIELDS matches the SQL: every RAISE of IQ409 and IQ422 builds DETAIL naming each field its error class reads", () => {
    for (const [code, fields] of Object.entries(DETAIL_FIELDS)) {
      const raises = functionFiles.flatMap((f) =>
        // To the `;` that ends a line: messages hold `;` of their own.
        [...f.text.matchAll(/RAISE EXCEPTION USING ERRCODE = '(IQ\w{3})',[\s\S]*?;$/gm)]
          .filter((m) => m[1] === code)
          .map((m) => ({ file: f.name, text: m[0] })),
      );
      expect(raises.length, code).toBeGreaterThan(0);
      for (const r of raises) {
        for (const field of fields) {
          expect(r.text, `${r.file}: ${code} DETAIL names ${field}`).toMatch(new RegExp(`DETAIL = jsonb_build_object\\([^;]*'${field}'`));
        }
      }
    }
  });

  it("DETAIL_SUBCLASSES matches the SQL: each refined code's DETAIL names the field exactly where it has the subclass's meaning", () => {
    // IQ410 with `owner` only from effect_done/effect_release (through
    // _raise_not_owner, which only they call), never from _raise_not_held (job_id).
    const raisers = (code: string, field: string) =>
      functionFiles
        .filter((f) =>
          [...f.text.matchAll(/RAISE EXCEPTION USING ERRCODE = '(IQ\w{3})',[\s\S]*?;/g)].some(
            (m) => m[1] === code && new RegExp(`DETAIL = jsonb_build_object\\([^;]*'${field}'`).test(m[0]),
          ),
        )
        .map((f) => f.name)
        .sort();
    expect(DETAIL_SUBCLASSES.IQ410?.field).toBe("owner");
    expect(raisers("IQ410", "owner")).toEqual(["_raise_not_owner"]);
    const callers = (helper: string) =>
      functionFiles
        .filter((f) => f.name !== helper && f.text.includes(`idemq.${helper}(`))
        .map((f) => f.name)
        .sort();
    expect(callers("_raise_not_owner")).toEqual(["effect_done", "effect_release"]);
    expect(raisers("IQ410", "job_id")).toEqual(["_raise_not_held"]);
  });
});

describe("typed call module", () => {
  it("SQL_FUNCTIONS parameter names equal pg_proc.proargnames (IN parameters, in order) for every public function", async () => {
    const { rows } = await db.pool.query<{ name: string; params: string[] }>(`
      SELECT p.proname AS name,
             -- proargmodes is NULL when every parameter is IN.
             ARRAY(SELECT a.name FROM unnest(p.proargnames, p.proargmodes) WITH ORDINALITY AS a(name, mode, ord)
                    WHERE a.name IS NOT NULL AND (a.mode IS NULL OR a.mode IN ('i', 'b', 'v')) ORDER BY a.ord) AS params
        FROM pg_proc p
       WHERE p.pronamespace = 'idemq'::regnamespace AND p.proname NOT LIKE '\\_%'
       ORDER BY 1`);
    const installed = Object.fromEntries(rows.map((r) => [r.name, r.params]));
    for (const [fn, params] of Object.entries(SQL_FUNCTIONS)) {
      expect(installed[fn], `idemq.${fn} is installed`).toBeDefined();
      expect(installed[fn], `parameters of idemq.${fn}`).toEqual([...params]);
    }
  });

  it("SCHEDULE_PARAMETERS (ScheduleDefinition's fields) names schedule()'s parameters, each once, in declaration order", () => {
    expect(Object.values(SCHEDULE_PARAMETERS)).toEqual([...SQL_FUNCTIONS.schedule]);
  });

  it("every public function in schema idemq is in SQL_FUNCTIONS, or is active_states/terminal_states", async () => {
    const publicFns = (await installedFunctions()).map((f) => f.name).filter((n) => !n.startsWith("_"));
    const notCallable = publicFns.filter((n) => !(n in SQL_FUNCTIONS));
    expect(notCallable.sort()).toEqual(["active_states", "terminal_states"]);
  });

  it("no public function is overloaded (one signature per name)", async () => {
    const names = (await installedFunctions()).map((f) => f.name);
    expect(names.filter((n, i) => names.indexOf(n) !== i)).toEqual([]);
  });
});

describe("the enqueue fields are listed once", () => {
  it("idemq._enqueue_fields() (the fields of idemq._planned_job after its plan fields) equals enqueue()'s parameter names, in order, and their types", async () => {
    const { rows } = await db.pool.query<{ names: string[]; types: string[]; fields: string[]; field_types: string[] }>(
      `SELECT (SELECT array_agg(a ORDER BY o) FROM unnest(p.proargnames) WITH ORDINALITY u(a, o) WHERE o <= p.pronargs) AS names,
              (SELECT array_agg(format_type(t, NULL) ORDER BY o) FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY u(t, o)) AS types,
              idemq._enqueue_fields() AS fields,
              (SELECT array_agg(format_type(a.atttypid, NULL) ORDER BY a.attnum) FROM pg_attribute a
               WHERE a.attrelid = 'idemq._planned_job'::regclass AND a.attname = ANY (idemq._enqueue_fields())) AS field_types
       FROM pg_proc p WHERE p.oid = 'idemq.enqueue'::regproc`,
    );
    expect(rows[0]!.fields).toEqual(rows[0]!.names);
    expect(rows[0]!.field_types).toEqual(rows[0]!.types);
  });
});

describe("the value rules of an enqueue and their wording", () => {
  it("every rule _job_rule_broken numbers (1..N, in order) has its wording in _job_problem, and _job_problem words no other number", () => {
    const file = (name: string) => functionFiles.find((f) => f.name === name)!.text;
    const body = (text: string) => text.slice(text.indexOf("RETURN CASE"), text.indexOf("\nEND;"));
    const rules = [...body(file("_job_rule_broken")).matchAll(/ THEN (\d+)$/gm)].map((m) => Number(m[1]));
    const worded = [...body(file("_job_problem")).matchAll(/^ {2}WHEN (\d+) THEN$/gm)].map((m) => Number(m[1]));
    expect(rules.length).toBeGreaterThan(10);
    expect(rules).toEqual(rules.map((_, i) => i + 1));
    expect(worded).toEqual(rules);
  });
});

describe("defaults live once", () => {
  it("idemq._job_defaults() equals the non-NULL DEFAULTs of enqueue()'s signature, and names no parameter whose default is NULL", async () => {
    const { rows } = await db.pool.query("SELECT pg_get_function_arguments('idemq.enqueue'::regproc) AS args, idemq._job_defaults() AS d");
    const defaults: Record<string, unknown> = {};
    const nullDefaults: string[] = [];
    for (const part of splitSqlList(rows[0].args)) {
      const m = /^(\w+) .+? DEFAULT (.+)$/.exec(part);
      if (!m) continue;
      const value = (await db.pool.query(`SELECT to_jsonb(${m[2]}) AS v`)).rows[0].v;
      if (value === null) nullDefaults.push(m[1]!);
      else defaults[m[1]!] = value;
    }
    expect(Object.keys(defaults).sort()).toEqual(["duplicate_policy", "key_retention", "max_attempts", "payload", "priority", "queue"]);
    expect(rows[0].d).toEqual(defaults);
    for (const name of nullDefaults) expect(rows[0].d, name).not.toHaveProperty(name);
    expect(nullDefaults.sort()).toEqual(["after", "backoff", "concurrency_key", "expires_at", "idempotency_key", "run_at", "timeout", "traceparent"]);
  });

  it("SCHEDULE_SQL_DEFAULTS (help texts) equals the non-NULL DEFAULTs of schedule()'s signature, by SCHEDULE_PARAMETERS", async () => {
    const { rows } = await db.pool.query("SELECT pg_get_function_arguments('idemq.schedule'::regproc) AS args");
    const sqlDefaults: Record<string, string> = {};
    for (const part of splitSqlList(rows[0].args)) {
      const m = /^(\w+) (.+?) DEFAULT (.+)$/.exec(part);
      if (!m) continue;
      const { t } = (await db.pool.query(`SELECT (${m[3]})::text AS t`)).rows[0];
      if (t !== null) sqlDefaults[m[1]!] = t;
    }
    // Each mirrored value read as the parameter's type, so '1 minute' and '00:01:00' are one interval.
    const mirrored: Record<string, string> = {};
    for (const [field, value] of Object.entries(SCHEDULE_SQL_DEFAULTS)) {
      const param = SCHEDULE_PARAMETERS[field as keyof typeof SCHEDULE_PARAMETERS];
      const type = /^(\w+) (.+?) DEFAULT/.exec(splitSqlList(rows[0].args).find((p) => p.startsWith(`${param} `))!)![2]!;
      mirrored[param] = (await db.pool.query(`SELECT $1::${type}::text AS t`, [value])).rows[0].t;
    }
    expect(mirrored).toEqual(sqlDefaults);
    expect(Object.keys(sqlDefaults).sort()).toEqual(["misfire", "misfire_grace", "overlap", "timezone"]);
  });

  it("enqueue_many applies the same defaults as enqueue (same stored row for the same job)", async () => {
    await inRollback(db.pool, async (c) => {
      const one = await c.query("SELECT job_id FROM idemq.enqueue(task => 'defaults')");
      const many = await c.query(`SELECT job_id FROM idemq.enqueue_many('[{"task": "defaults"}]')`);
      const read = (id: string) =>
        c.query("SELECT task, queue, payload, priority, max_attempts, state, backoff, expires_at FROM idemq.jobs WHERE id = $1", [id]);
      expect((await read(many.rows[0].job_id)).rows).toEqual((await read(one.rows[0].job_id)).rows);
    });
  });
});

describe("drift: installed functions equal sql/functions/", () => {
  it("every function in schema idemq has a file sql/functions/<family>/<name>.sql, and every file has its function", async () => {
    const installed = [...new Set((await installedFunctions()).map((f) => f.name))].sort();
    expect(installed).toEqual(functionFiles.map((f) => f.name));
  });

  it("each file defines exactly the function it is named after", () => {
    for (const f of functionFiles) {
      const creates = [...f.text.matchAll(/CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([\w.]+)\s*\(/gi)].map((m) => m[1]);
      expect(creates, f.name).toEqual([`idemq.${f.name}`]);
    }
  });

  it("plpgsql bodies: pg_proc.prosrc equals the file's $$...$$ body", async () => {
    const { rows } = await db.pool.query<{ name: string; src: string }>(
      "SELECT p.proname AS name, p.prosrc AS src FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace AND p.prosrc <> ''",
    );
    expect(rows.length).toBeGreaterThan(20);
    for (const { name, src } of rows) {
      const file = functionFiles.find((f) => f.name === name)!;
      const body = /AS \$\$([\s\S]*?)\$\$/.exec(file.text)?.[1];
      expect(body, `${name}.sql has a $$ body`).toBeDefined();
      expect(src.trim(), `idemq.${name} differs from sql/functions/${file.path}; carry the change in a new migration: npm run migration:new -- NAME`).toBe(
        body!.trim(),
      );
    }
  });

  it("replaying each file changes nothing: definition, comment and privileges stay as installed (covers SQL-standard bodies too)", async () => {
    const describeFn = `
      SELECT p.proname AS name, pg_get_functiondef(p.oid) AS def, obj_description(p.oid, 'pg_proc') AS comment,
             p.proacl::text AS acl, p.proconfig AS config
        FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace ORDER BY p.proname, p.oid`;
    await inRollback(db.pool, async (c) => {
      const before = (await c.query(describeFn)).rows;
      for (const f of functionFiles) await c.query(f.text);
      const after = (await c.query(describeFn)).rows;
      expect(after.map((r) => r.name), "no new function or overload appeared").toEqual(before.map((r) => r.name));
      for (let i = 0; i < before.length; i++) {
        expect(after[i], `idemq.${before[i].name}: the installed function differs from its file; carry the change in a new migration: npm run migration:new -- NAME`).toEqual(before[i]);
      }
    });
  });

  it("the latest migration state equals sql/functions/, both ways: npm run migration:check (scripts/migration-new.mjs --check) exits 0", async () => {
    const check = run(process.execPath, ["scripts/migration-new.mjs", "--check"], { cwd: ROOT });
    await expect(
      check.catch((error: { stderr?: string }) => Promise.reject(new Error(error.stderr))),
      `the migrations and sql/functions/ differ; carry the change in a new migration: npm run migration:new -- NAME`,
    ).resolves.toBeDefined();
  });
});

describe("function file headers", () => {
  it("each function name has one file across the family folders (a migration knows a function by its file's name)", () => {
    expect(functionFiles.length).toBeGreaterThan(90);
    expect(new Set(functionFiles.map((f) => f.path.split("/").length)), "every file is in a family folder").toEqual(new Set([2]));
    expect(duplicateNames(FUNCTIONS_DIR), "names with more than one file in sql/functions/").toEqual([]);
  });

  it.each(functionFiles.map((f) => [f.path, f] as const))("%s: signature, purpose, Guarantees, Concurrency, Errors, Tests, COMMENT ON FUNCTION", (_n, f) => {
    const lines = f.text.split("\n");
    const headerEnd = lines.findIndex((l) => !l.startsWith("--"));
    const header = lines.slice(0, headerEnd);
    expect(header[0], "first line: the signature").toMatch(new RegExp(`^-- idemq\\.${f.name}\\(.*`));
    expect(lines[headerEnd], "the header is followed by CREATE OR REPLACE FUNCTION").toMatch(
      new RegExp(`^CREATE OR REPLACE FUNCTION idemq\\.${f.name}\\(`),
    );

    const section = (label: string) => header.findIndex((l) => new RegExp(`^-- ${label}\\b[^:]*:`).test(l));
    const positions = ["Guarantees", "Concurrency", "Errors", "Tests"].map(section);
    for (const [i, label] of ["Guarantees", "Concurrency", "Errors", "Tests"].entries()) {
      expect(positions[i], `${label}: section`).toBeGreaterThan(0);
    }
    expect([...positions].sort((a, b) => a - b), "sections in the order Guarantees, Concurrency, Errors, Tests").toEqual(positions);

    // Purpose: text between the signature block (up to the first bare "--") and Guarantees.
    const blank = header.findIndex((l) => l.trim() === "--");
    expect(blank, "a blank comment line after the signature").toBeGreaterThan(0);
    const purpose = header.slice(blank + 1, positions[0]).filter((l) => l.replace(/^--\s*/, "").trim() !== "");
    expect(purpose.length, "a purpose sentence before Guarantees:").toBeGreaterThan(0);

    const tests = header.slice(positions[3]).join(" ");
    const named = [...tests.matchAll(/test\/[\w./-]+\.test\.ts/g)].map((m) => m[0]);
    expect(named.length, "Tests: names at least one test file").toBeGreaterThan(0);
    const missing = named.filter((t) => !existsSync(join(ROOT, t)));
    expect(missing, "test files named in Tests: that do not exist").toEqual([]);

    expect(f.text.trimEnd(), "ends with COMMENT ON FUNCTION").toMatch(
      new RegExp(`COMMENT ON FUNCTION idemq\\.${f.name}\\([^)]*\\) IS\\s+'(?:[^']|'')*';$`),
    );
  });
});

describe("privileges", () => {
  it("src/roles.ts's ROLE_FUNCTIONS are the functions the producer, worker and viewer roles may execute (besides the constants), as _grant_roles grants", async () => {
    const ROLES = await installationRoles(db.pool);
    for (const kind of ["producer", "worker", "viewer"] as const) {
      const { rows } = await db.pool.query<{ name: string }>(
        `SELECT p.proname AS name FROM pg_proc p
          WHERE p.pronamespace = 'idemq'::regnamespace AND has_function_privilege($1, p.oid, 'EXECUTE')
            AND p.proname NOT IN ('active_states', 'terminal_states', 'schema_version')
          ORDER BY 1`,
        [ROLES[kind]],
      );
      expect(rows.map((r) => r.name), ROLES[kind]).toEqual([...ROLE_FUNCTIONS[kind]].sort());
    }
  });

  it("PUBLIC may execute no function of idemq, public or private (the roles get theirs: test/sql/roles.test.ts)", async () => {
    const { rows } = await db.pool.query<{ name: string; public_exec: boolean }>(`
      SELECT p.proname AS name, has_function_privilege('public', p.oid, 'EXECUTE') AS public_exec
        FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace ORDER BY 1`);
    expect(rows.length).toBeGreaterThan(30);
    expect(rows.filter((r) => r.public_exec).map((r) => r.name), "functions executable by PUBLIC").toEqual([]);
  });

  it("every function pins search_path = pg_catalog, pg_temp, or has a SQL-standard body (its names bound at CREATE, and still inlined)", async () => {
    const { rows } = await db.pool.query<{ name: string; config: string[] | null; sql_body: boolean }>(`
      SELECT p.proname AS name, p.proconfig AS config, p.prosqlbody IS NOT NULL AS sql_body
        FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace ORDER BY 1`);
    const unpinned = rows.filter((r) => !r.sql_body && !(r.config ?? []).includes("search_path=pg_catalog, pg_temp"));
    expect(unpinned.map((r) => r.name), "functions whose search_path the caller decides").toEqual([]);
    // A SET on a SQL-standard body would only stop it being inlined.
    expect(rows.filter((r) => r.sql_body && r.config !== null).map((r) => r.name)).toEqual([]);
  });

  it("every public function but the two constants is SECURITY DEFINER; no private helper is but the settings triggers", async () => {
    const { rows } = await db.pool.query<{ name: string; definer: boolean }>(`
      SELECT p.proname AS name, p.prosecdef AS definer
        FROM pg_proc p WHERE p.pronamespace = 'idemq'::regnamespace ORDER BY 1`);
    const constants = ["active_states", "terminal_states"];
    // idemq_admin UPDATEs idemq.settings directly, and this trigger then
    // rewrites idemq.enqueue_limits and idemq.success_retention, on which
    // idemq_admin holds no write privilege.
    const definerTriggers = ["_keep_enqueue_limits", "_keep_success_retention"];
    expect(rows.filter((r) => r.name.startsWith("_") && r.definer).map((r) => r.name)).toEqual(definerTriggers);
    expect(rows.filter((r) => !r.name.startsWith("_") && !constants.includes(r.name) && !r.definer).map((r) => r.name)).toEqual([]);
    expect(rows.filter((r) => constants.includes(r.name) && r.definer).map((r) => r.name)).toEqual([]);
  });
});
