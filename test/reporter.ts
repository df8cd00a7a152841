// Prints the closing line CI reads: "N passed, N failed" (tests, not files).
// A file that fails outside its tests (an import error, a failing beforeAll
// with no test failing) and an unhandled error each count as one failure, so
// a red run can never print "0 failed".
import type { Reporter, SerializedError, TestModule } from "vitest/node";

export default class SummaryLineReporter implements Reporter {
  onTestRunEnd(testModules: ReadonlyArray<TestModule>, unhandledErrors: ReadonlyArray<SerializedError>): void {
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
    process.stdout.write(`${passed} passed, ${failed} failed\n`);
  }
}
