// Headless Chromium driven by playwright-core: Debian's /usr/bin/chromium
// (found and, when missing, installed by the test set-up: ./system-tools.ts),
// a fresh profile per launch (playwright makes one in a temporary directory
// and refuses --user-data-dir with launch()), and the flags that keep it from
// reaching the network (closed here: without them it stalls).
// Screenshots go to test-artifacts/ (kept by CI, not committed).
import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { chromium, type Browser, type Page } from "playwright-core";
import { CHROMIUM, toolPath } from "./system-tools.ts";

export const ARTIFACTS = resolve(import.meta.dirname, "..", "..", "test-artifacts");

const FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

export interface TestBrowser {
  browser: Browser;
  newPage(): Promise<Page>;
  close(): Promise<void>;
}

export async function launchBrowser(): Promise<TestBrowser> {
  const browser = await chromium.launch({ executablePath: toolPath(CHROMIUM), headless: true, args: FLAGS });
  return {
    browser,
    newPage: async () => {
      const page = await browser.newPage({ viewport: { width: 1200, height: 800 } });
      page.setDefaultTimeout(15_000);
      return page;
    },
    close: () => browser.close(),
  };
}

/** Saves test-artifacts/<name>.png (the viewport, 1200x800). */
export async function screenshot(page: Page, name: string): Promise<string> {
  mkdirSync(ARTIFACTS, { recursive: true });
  const path = join(ARTIFACTS, `${name}.png`);
  await page.screenshot({ path });
  return path;
}
