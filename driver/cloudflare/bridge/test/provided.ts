// What the global setup provides to the tests (vitest's inject).
declare module "vitest" {
  export interface ProvidedContext {
    managerURL: string;
    skipReason: string;
  }
}

export {};
