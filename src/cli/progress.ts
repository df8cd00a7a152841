// Progress of a long operation on stderr: shown on a terminal only, never
// with --json, so scripts and pipes get just the result on stdout.

/** Whether progress is drawn: on a terminal's stderr, and never with --json. */
function showsProgress(options: { json?: boolean | undefined }): boolean {
  return !options.json && process.stderr.isTTY === true;
}

export async function withProgress<T>(options: { json?: boolean | undefined }, label: string, work: () => Promise<T>): Promise<T> {
  const show = showsProgress(options);
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

export interface ProgressLine {
  /** Redraws the line with this count (e.g. "300 job(s) removed in 3 batch(es)"). */
  update(text: string): void;
  /** Adds a note after the count, e.g. "stopping after this batch". */
  note(text: string): void;
  /** Ends the line with the time taken (nothing when it was never drawn). */
  end(): void;
}

/** A progress line rewritten in place as a long loop goes (idemq purge's batches). */
export function progressLine(options: { json?: boolean | undefined }, label: string): ProgressLine {
  const show = showsProgress(options);
  const started = performance.now();
  let last = "";
  let extra = "";
  const draw = (): void => {
    if (show) process.stderr.write(`\r\x1b[Kidemq: ${label}: ${last}${extra}`);
  };
  return {
    update(text) {
      last = text;
      draw();
    },
    note(text) {
      extra = ` (${text})`;
      draw();
    },
    end() {
      if (show && last !== "") process.stderr.write(` in ${((performance.now() - started) / 1000).toFixed(1)} s\n`);
    },
  };
}
