// Serves the bridge in a real local workerd (miniflare) on 127.0.0.1, with
// the real cell agent behind each cell's Durable Object (the loopback
// container manager, test/manager.mjs): what the Go driver's tests run
// against. TEST ONLY: the cells are the test backend, never a Cloudflare
// Container.
//
//   node scripts/serve.mjs --agent BIN --token-file FILE --image REF --instance-type T [--record]
//
// Prints one JSON line {"bridge": URL, "manager": URL} when ready, and
// stops (killing every cell) when its stdin closes or on SIGTERM.

import { build } from "esbuild";
import { Miniflare } from "miniflare";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { startManager } from "../test/manager.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const { values } = parseArgs({
  options: {
    agent: { type: "string" },
    "token-file": { type: "string" },
    image: { type: "string" },
    "instance-type": { type: "string", default: "basic" },
    "container-class": { type: "string", default: "CellObject" },
    record: { type: "boolean", default: false },
  },
});
for (const k of ["agent", "token-file", "image"]) {
  if (!values[k]) {
    console.error(`serve.mjs: --${k} is required`);
    process.exit(2);
  }
}

const dir = mkdtempSync(join(tmpdir(), "sbw-bridge-serve-"));
const script = join(dir, "bridge.mjs");
await build({
  entryPoints: [join(here, "../test/entry.ts")],
  bundle: true,
  format: "esm",
  platform: "neutral",
  target: "es2022",
  external: ["cloudflare:*"],
  outfile: script,
  logLevel: "error",
});
const manager = await startManager(values.agent, { record: values.record });
const mf = new Miniflare({
  modules: true,
  scriptPath: script,
  modulesRoot: dir,
  compatibilityDate: "2026-04-26",
  compatibilityFlags: ["enable_request_signal"],
  host: "127.0.0.1",
  port: 0,
  durableObjects: { CELLS: "CellObject", REGISTRY: "Registry" },
  bindings: {
    BRIDGE_TOKEN: readFileSync(values["token-file"], "utf8").trim(),
    CELL_IMAGE: values.image,
    CELL_INSTANCE_TYPE: values["instance-type"],
    CONTAINER_CLASS: values["container-class"],
    LOOPBACK_MANAGER: manager.url,
  },
});
const url = await mf.ready;
process.stdout.write(JSON.stringify({ bridge: url.origin, manager: manager.url }) + "\n");

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  await mf.dispose().catch(() => {});
  await manager.close().catch(() => {});
  rmSync(dir, { recursive: true, force: true });
  process.exit(0);
}
process.stdin.on("end", stop);
process.stdin.on("close", stop);
process.stdin.resume();
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
