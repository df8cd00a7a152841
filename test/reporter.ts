// Prints the closing line CI reads: "N passed, N failed" (tests, not files).
// So that a red run never prints "0 failed", a file that fails outside its
// tests (an import error, a failing beforeAll) and each unhandled error count
// as one failure, and a run vitest calls failed with nothing counted (a
// global setup that threw, no test files found) counts as one.
import type { Reporter, SerializedError, TestModule, TestRunEndReason } from "vitest/node";

export default class SummaryLineReporter implements Reporter {
  onTestRunEnd(
    testModules: ReadonlyArray<TestModule>,
    unhandledErrors: ReadonlyArray<SerializedError>,
    reason: TestRunEndReason,
  ): void {
    let passed = 0;
    let failed = 0;
    for (const testModule of testModules) {
      let failedHere = 0;
      for (const test of testModule.children.allTests()) {
        const state = test.result().state;
        if (state === "passed") passed++;
        else if (state === "failed") failedHere++;
      }
      if (failedHere === 0 && (testModule.state() === "failed" || testModule.errors().length > 0)) failedHere = 1;
      failed += failedHere;
    }
    failed += unhandledErrors.length;
    if (reason !== "passed" && failed === 0) failed = 1;
    process.stdout.write(`${passed} passed, ${failed} failed\n`);
  }
}
