// Values handed from test/global-setup.ts to the test files (inject("...")).
declare module "vitest" {
  export interface ProvidedContext {
    /** A connection string to the test server's maintenance database (DATABASE_URL or the embedded server). */
    idemqServerUrl: string;
    /** Name of the migrated template database; test files clone it. */
    idemqTemplate: string;
  }
}

export {};
