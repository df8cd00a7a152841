// A local stand-in for an email API (HTTP on 127.0.0.1, a free port) that
// honours the Idempotency-Key header the way Stripe and the IETF draft
// describe: the first request with a key delivers the email and stores the
// answer; a later request with the same key gets the same answer back
// (header Idempotent-Replayed: true) and delivers nothing.
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface Email {
  to: string;
  subject: string;
}

export interface SendAnswer {
  messageId: string;
}

export interface FakeEmailProvider {
  /** Base URL; POST /emails sends one email. */
  url: string;
  /** Every request, replays included. */
  requests: number;
  /** Requests answered from an earlier request with the same key. */
  replays: number;
  /** Emails actually delivered, per Idempotency-Key. */
  deliveriesByKey: Map<string, number>;
  /** Emails each recipient received. */
  inbox: Map<string, Email[]>;
  /**
   * Called after an email was delivered and before the answer goes out;
   * the answer waits for the promise (the demo kills the sender here).
   */
  onDelivered: ((email: Email, key: string) => Promise<void> | void) | undefined;
  close(): Promise<void>;
}

export async function startFakeEmailProvider(): Promise<FakeEmailProvider> {
  const answers = new Map<string, SendAnswer>();
  let delivered = 0;
  const provider: FakeEmailProvider = {
    url: "",
    requests: 0,
    replays: 0,
    deliveriesByKey: new Map(),
    inbox: new Map(),
    onDelivered: undefined,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };

  const handle = async (req: IncomingMessage, res: ServerResponse, body: string): Promise<void> => {
    provider.requests++;
    const key = req.headers["idempotency-key"];
    if (req.method !== "POST" || req.url !== "/emails") return answer(res, 404, { error: "POST /emails" });
    if (typeof key !== "string" || key === "") return answer(res, 400, { error: "an Idempotency-Key header is required" });
    const earlier = answers.get(key);
    if (earlier !== undefined) {
      provider.replays++;
      return answer(res, 200, earlier, { "idempotent-replayed": "true" });
    }
    let email: Email;
    try {
      email = JSON.parse(body) as Email;
    } catch {
      return answer(res, 400, { error: "the body is not JSON" });
    }
    const sent: SendAnswer = { messageId: `msg-${++delivered}` };
    answers.set(key, sent);
    provider.deliveriesByKey.set(key, (provider.deliveriesByKey.get(key) ?? 0) + 1);
    provider.inbox.set(email.to, [...(provider.inbox.get(email.to) ?? []), email]);
    await provider.onDelivered?.(email, key);
    answer(res, 200, sent);
  };

  const server = createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (chunk: string) => (body += chunk));
    req.on("end", () => {
      handle(req, res, body).catch((error: unknown) => answer(res, 500, { error: String(error) }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  provider.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return provider;
}

function answer(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  // The client may be gone (a killed worker): nothing to answer then.
  if (res.destroyed) return;
  res.on("error", () => {});
  res.writeHead(status, { "content-type": "application/json", ...headers }).end(JSON.stringify(body));
}
