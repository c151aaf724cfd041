// Builds the real cell agent and starts the loopback container manager for
// the bridge's tests (in Node, outside workerd). Without root or unshare
// the tests are skipped locally and fail under CI=true.

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import type { TestProject } from "vitest/node";
// @ts-expect-error: a plain ES module without types
import { buildAgent, startManager } from "./manager.mjs";

import "./provided.js";

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const dir = mkdtempSync(join(tmpdir(), "sbw-bridge-test-"));
  let close = async (): Promise<void> => {};
  try {
    const bin = process.env["SANDBOXWICH_AGENT_BIN"] ?? buildAgent(resolve(__dirname, "../../../.."), dir);
    const m = await startManager(bin);
    close = m.close;
    project.provide("managerURL", m.url);
    project.provide("skipReason", "");
  } catch (e) {
    const why = `the real cell agent cannot run here: ${(e as Error).message}`;
    if (process.env["CI"] === "true") throw new Error(why);
    project.provide("managerURL", "http://127.0.0.1:9");
    project.provide("skipReason", why);
  }
  return async () => {
    await close();
    rmSync(dir, { recursive: true, force: true });
  };
}
