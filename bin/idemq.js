#!/usr/bin/env node
// Launcher: Node 20 cannot run TypeScript by itself, so register tsx first.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../src/cli/main.ts");
process.exitCode = await main(process.argv);
