// Progress on stderr: step lines, and a bar for the long steps. On a terminal
// the bar redraws one line in place; elsewhere (a pipe, a CI log) it prints a
// plain line when it starts and one when it ends, nothing in between.

export interface ProgressBar {
  /** Sets how much is done (out of the total given to bar()). */
  update(done: number): void;
  /** Ends the bar with a final line. */
  finish(line: string): void;
}

const BAR_WIDTH = 24;
const REDRAW_MS = 50;

export class Progress {
  private readonly tty: boolean;
  private readonly color: boolean;
  private readonly started = performance.now();

  constructor(private readonly out: NodeJS.WritableStream & { isTTY?: boolean } = process.stderr) {
    this.tty = out.isTTY === true;
    this.color = this.tty && process.env.NO_COLOR === undefined;
  }

  /** One line: a step of the demo. */
  step(text: string): void {
    this.out.write(`${this.dim(this.clock())} ${text}\n`);
  }

  /** A heading for one part of the demo. */
  section(text: string): void {
    this.out.write(`\n${this.bold(text)}\n`);
  }

  bar(label: string, total: number): ProgressBar {
    let done = 0;
    let drawn = 0;
    let finished = false;
    const draw = (): void => {
      drawn = performance.now();
      const filled = total === 0 ? BAR_WIDTH : Math.round((Math.min(done, total) / total) * BAR_WIDTH);
      const bar = `${"#".repeat(filled)}${"-".repeat(BAR_WIDTH - filled)}`;
      this.out.write(`\r\x1b[2K${this.dim(this.clock())} ${label} [${bar}] ${done}/${total}`);
    };
    if (this.tty) draw();
    else this.step(`${label} (${total})...`);
    return {
      update: (value) => {
        done = value;
        if (finished || !this.tty) return;
        if (performance.now() - drawn >= REDRAW_MS || done >= total) draw();
      },
      finish: (line) => {
        if (finished) return;
        finished = true;
        if (this.tty) this.out.write("\r\x1b[2K");
        this.step(line);
      },
    };
  }

  private clock(): string {
    return `[${((performance.now() - this.started) / 1000).toFixed(1).padStart(4)}s]`;
  }

  private dim(text: string): string {
    return this.color ? `\x1b[2m${text}\x1b[22m` : text;
  }

  private bold(text: string): string {
    return this.color ? `\x1b[1m${text}\x1b[22m` : text;
  }
}
