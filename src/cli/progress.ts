// Progress of a long operation on stderr: shown on a terminal only, never
// with --json, so scripts and pipes get just the result on stdout.
export async function withProgress<T>(options: { json?: boolean | undefined }, label: string, work: () => Promise<T>): Promise<T> {
  const show = !options.json && process.stderr.isTTY === true;
  const started = performance.now();
  if (show) process.stderr.write(`idemq: ${label} ...`);
  try {
    const result = await work();
    if (show) process.stderr.write(` done in ${((performance.now() - started) / 1000).toFixed(1)} s\n`);
    return result;
  } catch (error) {
    if (show) process.stderr.write(" failed\n");
    throw error;
  }
}
