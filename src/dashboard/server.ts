// startDashboard(): the dashboard's HTTP server. Routes are a short table;
// each page is a module that reads through job-reads.ts or an idemq.*
// function and returns html``. Nothing here logs a request, so no payload,
// key or error text is ever written to a log.
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type pg from "pg";
import type { MetricsRegistry } from "../metrics/registry.ts";
import { respondWithMetrics } from "../metrics/serve.ts";
import { CHARTS_SCRIPT, chartsPage } from "./charts-page.ts";
import { confirmJobAction, confirmPurge, purgeForm, runJobAction, runLimitAction, runPurge } from "./actions.ts";
import { access, checkBind, hostAllowed, newSecret, sameSecret } from "./auth.ts";
import { BadRequest } from "./bad-request.ts";
import { confirmBulk, runBulk } from "./bulk-page.ts";
import { html, type Html } from "./html.ts";
import { jobId, jobPage, JOB_ACTIONS, type JobAction } from "./job-page.ts";
import { jobsCount, jobsPage, JOBS_SCRIPT } from "./jobs-page.ts";
import { LIMIT_ACTIONS, limitsPage, type LimitAction } from "./limits-page.ts";
import { page, READ_ONLY_LINE } from "./layout.ts";
import { OVERVIEW_SCRIPT, overviewPage } from "./overview-page.ts";
import { schedulesPage } from "./schedules-page.ts";
import { workersPage } from "./workers-page.ts";

export const DASHBOARD_DEFAULTS = { host: "127.0.0.1", port: 8080 } as const;
/** A form body larger than this is refused (the forms hold a few short fields). */
const MAX_FORM_BYTES = 16 * 1024;

export interface DashboardOptions {
  /** The pool the pages read through; its role decides what the actions may do (the installation's admin role). */
  pool: pg.Pool;
  /** 0 binds a free port (see `url`). Default 8080. */
  port?: number;
  /** Default 127.0.0.1. Any address that is not loopback needs `token`. */
  host?: string;
  /** Required beyond loopback: ?token=, a cookie after it, or Authorization: Bearer. */
  token?: string | undefined;
  /** Served on /metrics when given (the same registry as `idemq metrics`). */
  metrics?: MetricsRegistry | undefined;
  /** How long one request of a bulk action runs its batches of 1,000 before the page posts the next (at least one batch). Default 2000. */
  bulkRequestMs?: number | undefined;
}

export interface Dashboard {
  readonly url: string;
  readonly port: number;
  close(): Promise<void>;
}

interface Rendered {
  title: string;
  body: Html;
  script?: string;
  /** The pool's role may look, not act (the installation's viewer): the layout says so and shows no action. */
  readOnly?: boolean;
}

type Response = { status: number; rendered: Rendered } | { status: 303; location: string } | { status: number; json: unknown };

export async function startDashboard(options: DashboardOptions): Promise<Dashboard> {
  const host = options.host ?? DASHBOARD_DEFAULTS.host;
  checkBind(host, options.token);
  const csrf = newSecret();
  const db = options.pool;

  async function route(req: IncomingMessage, url: URL): Promise<Response | null> {
    const parts = url.pathname.split("/").filter((p) => p !== "");
    const get = req.method === "GET" || req.method === "HEAD";
    const post = req.method === "POST";
    const viewer = get && (await readOnly(db));
    const ok = (rendered: Rendered | null) => (rendered === null ? null : { status: 200, rendered: { ...rendered, readOnly: viewer } });
    if (get && parts.length === 0) return ok({ ...(await overviewPage(db, url.searchParams)), script: OVERVIEW_SCRIPT });
    if (get && url.pathname === "/jobs") {
      const jobs = await jobsPage(db, url.searchParams);
      return { status: jobs.status, rendered: { ...jobs, script: JOBS_SCRIPT, readOnly: viewer } };
    }
    if (get && url.pathname === "/jobs/count") {
      const counted = await jobsCount(db, url.searchParams);
      return { status: counted.status, json: counted.body };
    }
    if (get && url.pathname === "/bulk") return ok(await confirmBulk(db, url.searchParams, csrf));
    if (post && url.pathname === "/bulk") return ok(await runBulk(db, await readForm(req, csrf), csrf, options.bulkRequestMs));
    if (get && url.pathname === "/workers") return ok(await workersPage(db));
    if (get && url.pathname === "/schedules") return ok(await schedulesPage(db));
    if (get && url.pathname === "/charts") return ok({ ...(await chartsPage(db, url.searchParams)), script: CHARTS_SCRIPT });
    if (get && url.pathname === "/limits") return ok(await limitsPage(db, csrf, url.searchParams.get("done") ?? undefined));
    if (post && parts[0] === "limits" && parts.length === 2 && LIMIT_ACTIONS.includes(parts[1] as LimitAction)) {
      const form = await readForm(req, csrf);
      const notice = await runLimitAction(db, parts[1] as LimitAction, form);
      return { status: 303, location: `/limits?done=${encodeURIComponent(notice)}` };
    }
    if (get && url.pathname === "/purge") {
      const done = url.searchParams.get("done");
      const form = purgeForm();
      return ok(done === null ? form : { ...form, body: html`<p class="note" id="notice">${done}</p>${form.body}` });
    }
    if (get && url.pathname === "/purge/confirm") return ok(confirmPurge(url.searchParams, csrf));
    if (post && url.pathname === "/purge") {
      const form = await readForm(req, csrf);
      return { status: 303, location: `/purge?done=${encodeURIComponent(await runPurge(db, form))}` };
    }
    if (parts[0] === "jobs" && parts[1] !== undefined && parts.length <= 3) {
      const id = jobId(parts[1]);
      if (parts.length === 2 && get) return ok(await jobPage(db, id, url.searchParams.get("done") ?? undefined, viewer));
      const action = parts[2] as JobAction;
      if (!JOB_ACTIONS.includes(action)) return null;
      if (get) return ok(await confirmJobAction(db, id, action, csrf));
      if (post) {
        const form = await readForm(req, csrf);
        const notice = await runJobAction(db, id, action, form);
        return { status: 303, location: `/jobs/${id}?done=${encodeURIComponent(notice)}` };
      }
    }
    return null;
  }

  const server = createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://dashboard");
    if (!hostAllowed(req, options.token)) {
      send(res, 421, errorPage("Wrong host", "Without a token this dashboard answers only to a loopback address (127.0.0.1, localhost, [::1]): open it by one, or start it with --token."));
      return;
    }
    const granted = access(req, url, options.token);
    if (!granted.ok) {
      send(res, 401, errorPage("Token needed", "This dashboard needs its token: open it with ?token=TOKEN (then a cookie keeps it) or send Authorization: Bearer TOKEN."));
      return;
    }
    if (granted.setCookie !== undefined) {
      // Drop the token from the address bar (and from the history) once the cookie holds it.
      url.searchParams.delete("token");
      res.writeHead(303, { "set-cookie": granted.setCookie, location: url.pathname + url.search }).end();
      return;
    }
    if (url.pathname === "/metrics") {
      if (options.metrics === undefined) {
        res.writeHead(503, { "content-type": "text/plain; charset=utf-8" }).end("metrics need prom-client: `npm install prom-client@15`\n");
      } else respondWithMetrics(options.metrics, req, res);
      return;
    }
    route(req, url).then(
      (response) => {
        if (response === null) send(res, 404, errorPage("Not found", `Nothing at ${url.pathname}.`));
        else if ("location" in response) res.writeHead(303, { location: response.location }).end();
        else if ("json" in response) {
          res.writeHead(response.status, { "content-type": "application/json; charset=utf-8", "x-content-type-options": "nosniff", "cache-control": "no-store" });
          res.end(JSON.stringify(response.json));
        }
        else send(res, response.status, response.rendered);
      },
      (error: unknown) => {
        const [status, title, message] = describeError(error);
        if (status !== 403) return send(res, status, errorPage(title, message));
        // Refused by the database: say so plainly when the role is the read-only one.
        readOnly(db).then(
          (viewer) => send(res, status, errorPage(title, viewer ? `${READ_ONLY_LINE}: the database refused this action (${message})` : message)),
          () => send(res, status, errorPage(title, message)),
        );
      },
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? DASHBOARD_DEFAULTS.port, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://${host.includes(":") ? `[${host}]` : host}:${port}/`,
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

function send(res: ServerResponse, status: number, rendered: Rendered): void {
  const nonce = newSecret();
  res
    .writeHead(status, {
      "content-type": "text/html; charset=utf-8",
      // Nothing from elsewhere, no framing, scripts only with this response's nonce; they may fetch from here (the jobs page's count).
      "content-security-policy": `default-src 'none'; style-src 'unsafe-inline'; script-src 'nonce-${nonce}'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'`,
      "x-content-type-options": "nosniff",
      "referrer-policy": "no-referrer",
      "cache-control": "no-store",
    })
    .end(
      page(rendered.title, rendered.body, { nonce, readOnly: rendered.readOnly === true, ...(rendered.script === undefined ? {} : { script: rendered.script }) })
        .text,
    );
}

/**
 * Whether the pool's role may look but not act: it may read jobs (find_jobs)
 * and not retry one, as the installation's viewer. A catalog read per page;
 * it only decides what the page shows: the database refuses the actions.
 * The functions are named, not their signatures (::regproc: one signature per
 * name), so a changed argument list does not break the check.
 */
async function readOnly(db: pg.Pool): Promise<boolean> {
  const { rows } = await db.query<{ read_only: boolean }>(
    `SELECT has_function_privilege('idemq.find_jobs'::regproc, 'EXECUTE')
        AND NOT has_function_privilege('idemq.retry'::regproc, 'EXECUTE') AS read_only`,
  );
  return rows[0]?.read_only === true;
}

function errorPage(title: string, message: string): Rendered {
  return { title, body: html`<p class="error" id="error">${message}</p>` };
}

/** Status, title and message for a failed page or action; the message names what was wrong. */
function describeError(error: unknown): [number, string, string] {
  if (error instanceof BadRequest) return [400, "Bad request", error.message];
  const e = error as { code?: unknown; message?: unknown; hint?: unknown };
  const message = typeof e.message === "string" ? e.message : String(error);
  const hint = typeof e.hint === "string" ? ` ${e.hint}` : "";
  if (e.code === "42501") {
    // ROLE is left for the reader to fill in: the error does not say which login role the pool connected as.
    return [
      403,
      "Not allowed",
      `${message}. The dashboard's database role needs this installation's admin role for this: \`idemq roles grant ROLE --admin\`, ROLE being the role it connects as.`,
    ];
  }
  if (e.code === "IQ404") return [404, "Not found", `${message}${hint}`];
  if (typeof e.code === "string" && (e.code.startsWith("IQ4") || e.code.startsWith("22"))) return [409, "Refused", `${message}${hint}`];
  return [500, "Dashboard error", message];
}

/** A POST's urlencoded body, refused unless it carries this server's CSRF token. */
async function readForm(req: IncomingMessage, csrf: string): Promise<URLSearchParams> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_FORM_BYTES) throw new BadRequest(`the form is over ${MAX_FORM_BYTES} bytes`);
    chunks.push(chunk);
  }
  const form = new URLSearchParams(Buffer.concat(chunks).toString("utf8"));
  const given = form.get("csrf");
  if (given === null || !sameSecret(given, csrf)) {
    throw new BadRequest("the form's CSRF token is missing or stale (the dashboard restarted?): reload the page and submit again");
  }
  return form;
}
