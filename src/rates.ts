// Throughput and failure rate over a recent window, from the counts of jobs
// that finished in it (overview()'s succeeded_recent and failed_recent): the
// one formula the dashboard's overview and `idemq stats` both show.

export interface RecentRates {
  /** Jobs that finished (succeeded or failed) per minute of the window. */
  perMinute: number;
  /** failed / (succeeded + failed) within the window, 0..1; null when none finished. */
  failureRate: number | null;
}

export function recentRates(succeeded: number, failed: number, windowMinutes: number): RecentRates {
  const done = succeeded + failed;
  return { perMinute: done / windowMinutes, failureRate: done === 0 ? null : failed / done };
}
