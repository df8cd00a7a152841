// Where a payload's JSON syntax error is, read from JSON.parse's own error
// (src/cli/parse.ts, jsonErrorAt). Node 20 says "at position N"; Node 22 adds
// "(line L column C)"; "Unexpected token" errors carry no position at all.
// The real errors of the running Node are checked, and each other message
// shape is constructed, so both Nodes' shapes are covered on either Node.
import { describe, expect, it } from "vitest";
import { jsonErrorAt } from "../../src/cli/parse.ts";

function realError(text: string): SyntaxError {
  try {
    JSON.parse(text);
  } catch (error) {
    return error as SyntaxError;
  }
  throw new Error(`${text} is valid JSON`);
}

describe("jsonErrorAt: the position of a JSON syntax error", () => {
  it("reads JSON.parse's own position, on this Node, and names line and column", () => {
    const problem = jsonErrorAt('{"orderId": 42,}', realError('{"orderId": 42,}'));
    expect(problem).toEqual({ message: "expected double-quoted property name", position: 15, line: 1, column: 16 });
  });

  it('reads Node 20\'s "at position N", counting lines itself', () => {
    const text = '{\n  "a": 1,\n}';
    const problem = jsonErrorAt(text, new SyntaxError("Expected double-quoted property name in JSON at position 12"));
    expect(problem).toEqual({ message: "expected double-quoted property name", position: 12, line: 3, column: 1 });
  });

  it('takes Node 22\'s "(line L column C)" as it is', () => {
    const text = '{\n  "a": 1,\n}';
    const message = "Expected double-quoted property name in JSON at position 12 (line 3 column 1)";
    expect(jsonErrorAt(text, new SyntaxError(message))).toEqual({
      message: "expected double-quoted property name",
      position: 12,
      line: 3,
      column: 1,
    });
  });

  it("finds an unexpected token, which no Node positions, by bisection: a misspelt literal where its word starts", () => {
    const text = '{\n  "a": tru\n}';
    expect(realError(text).message).not.toMatch(/position/);
    expect(jsonErrorAt(text, realError(text))).toEqual({ message: 'unexpected "tru"', position: 9, line: 2, column: 8 });
    const constructed = new SyntaxError(`Unexpected token '\n', "${text}" is not valid JSON`);
    expect(jsonErrorAt(text, constructed)).toEqual(jsonErrorAt(text, realError(text)));
  });

  it("finds an unexpected character far into a long payload", () => {
    const text = `{"items": [${"1, ".repeat(5_000)}}]}`;
    const position = text.indexOf("}");
    expect(jsonErrorAt(text, realError(text))).toEqual({ message: 'unexpected "}"', position, line: 1, column: position + 1 });
  });

  it("places the end of the input after its last character", () => {
    expect(jsonErrorAt('{"a": [1,\n', realError('{"a": [1,\n'))).toEqual({
      message: "unexpected end of input",
      position: 10,
      line: 2,
      column: 1,
    });
    expect(jsonErrorAt("", realError(""))).toEqual({ message: "unexpected end of input", position: 0, line: 1, column: 1 });
  });
});
