#!/usr/bin/env node
// Launcher: runs the compiled CLI in dist/ (`npm run build`; `npm ci` in a clone
// and `npm pack` build it through `prepare`). No TypeScript transpiler is
// loaded here: only a TypeScript tasks module (`idemq worker --tasks x.ts`)
// brings in tsx, and only then.
let cli;
try {
  cli = await import("../dist/cli/main.js");
} catch (error) {
  if (error?.code === "ERR_MODULE_NOT_FOUND" && String(error.message).includes("dist/cli/main.js")) {
    process.stderr.write("idemq: dist/ is missing: build the package with `npm run build` (npm ci runs it)\n");
    process.exit(1);
  }
  throw error;
}
process.exitCode = await cli.main(process.argv);
