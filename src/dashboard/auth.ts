// Who may use the dashboard. Loopback binds need nothing (as `idemq metrics`);
// any other address needs a token, given once as ?token= (kept in an
// HttpOnly cookie) or on every request as `Authorization: Bearer`. Every
// POST carries the server's CSRF token in a hidden field. Tokens are
// compared in constant time.
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { isIP } from "node:net";
import type { IncomingMessage } from "node:http";

export const TOKEN_ENV = "IDEMQ_DASHBOARD_TOKEN";
export const TOKEN_COOKIE = "idemq_dashboard_token";

/** 127.0.0.0/8, ::1 and localhost: reachable from this machine only. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  if (h === "localhost" || h === "::1") return true;
  if (h.startsWith("::ffff:")) return isLoopback(h.slice("::ffff:".length));
  return isIP(h) === 4 && h.startsWith("127.");
}

/** Raised before anything listens: a bind beyond loopback without a token. */
export class DashboardConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "DashboardConfigError";
  }
}

export function checkBind(host: string, token: string | undefined): void {
  if (token !== undefined && token.length < 16) {
    throw new DashboardConfigError(`the dashboard token must be at least 16 characters (got ${token.length}): e.g. --token "$(openssl rand -hex 16)"`);
  }
  if (!isLoopback(host) && token === undefined) {
    throw new DashboardConfigError(
      `binding ${host} (not loopback) needs an auth token: pass --token TOKEN or set ${TOKEN_ENV}, or bind 127.0.0.1`,
    );
  }
}

export function sameSecret(given: string, expected: string): boolean {
  // Digests have one length, so neither the comparison nor its length check leaks the secret's.
  const digest = (s: string) => createHash("sha256").update(s).digest();
  return timingSafeEqual(digest(given), digest(expected));
}

export function newSecret(): string {
  return randomBytes(24).toString("base64url");
}

export function cookie(req: IncomingMessage, name: string): string | undefined {
  for (const part of (req.headers.cookie ?? "").split(";")) {
    const at = part.indexOf("=");
    if (at > 0 && part.slice(0, at).trim() === name) return decodeURIComponent(part.slice(at + 1).trim());
  }
  return undefined;
}

/**
 * Without a token the dashboard trusts loopback, so it must also refuse a
 * request whose Host is a name other than a loopback one: a web page whose
 * domain was made to resolve to 127.0.0.1 (DNS rebinding) would otherwise
 * read the pages from the user's browser.
 */
export function hostAllowed(req: IncomingMessage, token: string | undefined): boolean {
  if (token !== undefined) return true;
  const header = req.headers.host ?? "";
  const name = header.startsWith("[") ? header.slice(0, header.indexOf("]") + 1) : header.replace(/:\d+$/, "");
  return isLoopback(name);
}

export type Access = { ok: true; setCookie?: string } | { ok: false };

/** Whether `req` carries the token (none needed when there is none); a ?token= that matches sets the cookie. */
export function access(req: IncomingMessage, url: URL, token: string | undefined): Access {
  if (token === undefined) return { ok: true };
  const bearer = /^Bearer (.+)$/i.exec(req.headers.authorization ?? "")?.[1];
  if (bearer !== undefined && sameSecret(bearer, token)) return { ok: true };
  const fromCookie = cookie(req, TOKEN_COOKIE);
  if (fromCookie !== undefined && sameSecret(fromCookie, token)) return { ok: true };
  const fromQuery = url.searchParams.get("token");
  if (fromQuery !== null && sameSecret(fromQuery, token)) {
    return { ok: true, setCookie: `${TOKEN_COOKIE}=${encodeURIComponent(token)}; HttpOnly; SameSite=Strict; Path=/` };
  }
  return { ok: false };
}
