// A file of an application's plain mistakes with typed tasks, and the errors
// tsc must report for it: used against the sources (test/contract/typed-tasks.test.ts)
// and against the built package's declarations (test/install/package.test.ts).

/** The file's text; an ES module (write it as .mts, or into a "type": "module" app). */
export const MISTAKES_SOURCE = [
  'import { Client, defineTasks } from "idemq";',
  "const tasks = defineTasks({ credit: async (p: { orderId: number; amount: number }) => p.amount });",
  'const client = new Client<typeof tasks>({ connectionString: "postgres://localhost/app" });',
  'await client.enqueue("credit", { orderId: "42", amount: 10 });',
  'await client.enqueue("credit", { orderId: 42 });',
  'await client.enqueue("debit", { orderId: 42, amount: 10 });',
  "",
].join("\n");

/** One pattern per error, in order, for a file named `fileName` (tsc --pretty false output). */
export function expectedMistakes(fileName: string): RegExp[] {
  const at = (line: number) => `${fileName.replaceAll(".", "\\.")}\\(${line},\\d+\\)`;
  return [
    new RegExp(`${at(4)}: error TS2322: Type 'string' is not assignable to type 'number'\\.`),
    new RegExp(
      `${at(5)}: error TS2345: Argument of type '\\{ orderId: number; \\}' is not assignable to parameter of type '\\{ orderId: number; amount: number; \\}'\\.`,
    ),
    new RegExp(`${at(6)}: error TS2345: Argument of type '"debit"' is not assignable to parameter of type '"credit"'\\.`),
  ];
}
