// A TypeScript tasks module (`idemq worker --tasks tasks.ts`) needs a loader:
// Node 20 cannot run TypeScript. tsx is not a dependency of idemq (the package
// ships JavaScript), so it is loaded only here, only for such a module, from
// idemq's own dependencies or the user's project (the current directory).
import { createRequire } from "node:module";
import { extname, join } from "node:path";
import { pathToFileURL } from "node:url";
import { UsageError } from "./output.ts";

const TYPESCRIPT_EXTENSIONS = new Set([".ts", ".mts", ".cts"]);

const TSX_MISSING =
  "a TypeScript tasks module needs tsx: install it with `npm install --save-dev tsx`, or compile the module to JavaScript";

let registered = false;

/**
 * Registers tsx when `file` is TypeScript; a no-op for JavaScript. Without
 * tsx it throws TSX_MISSING as a UsageError: like a module without tasks, it
 * is a configuration error the user fixes (exit 2), not a failure to retry.
 */
export async function prepareToImport(file: string): Promise<void> {
  if (registered || !TYPESCRIPT_EXTENSIONS.has(extname(file))) return;
  const api = await importTsx();
  if (api === undefined) {
    // Node 22.18+/23.6+ strip types themselves; nothing to register there.
    if ((process.features as { typescript?: unknown }).typescript) return;
    throw new UsageError(TSX_MISSING);
  }
  api.register();
  registered = true;
}

type TsxApi = { register: () => unknown };

async function importTsx(): Promise<TsxApi | undefined> {
  try {
    return (await import("tsx/esm/api")) as TsxApi;
  } catch (error) {
    if (!isModuleNotFound(error)) throw error;
  }
  try {
    // idemq installed globally or in another tree: the user's own tsx.
    const path = createRequire(join(process.cwd(), "package.json")).resolve("tsx/esm/api");
    return (await import(pathToFileURL(path).href)) as TsxApi;
  } catch (error) {
    if (isModuleNotFound(error)) return undefined;
    throw error;
  }
}

function isModuleNotFound(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === "ERR_MODULE_NOT_FOUND" || code === "MODULE_NOT_FOUND";
}
