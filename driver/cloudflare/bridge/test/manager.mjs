// The loopback container manager: what stands in for Cloudflare's container
// runtime in tests (there is no container runtime here). It starts the REAL
// cell agent binary for a cell in its own mount and PID namespaces
// (unshare: the agent is PID 1 there, with private /tmp and /home), listening
// on a loopback TCP port, and answers the bridge's LoopbackContainer:
//
//   POST   /containers/:cell/start    start (idempotent) → {instance, port}
//   GET    /containers/:cell          the running instance, or 404
//   DELETE /containers/:cell          stop it (SIGKILL of the namespace)
//   POST   /containers/:cell/restart  TEST FAULT: stop it and start a new instance
//   GET    /containers/:cell/record   with {record: true}: what its agent received
//   GET    /containers                every running cell
//
// It needs root (namespaces, the agent's user switch) and listens on
// 127.0.0.1 only.

import { spawn, execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { copyFileSync, chmodSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import http from "node:http";
import { join } from "node:path";

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function waitPort(port, proc, ms) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (proc.exitCode !== null || proc.signalCode !== null) throw new Error("the agent exited at start");
    try {
      const r = await fetch(`http://127.0.0.1:${port}/v1/status`);
      await r.arrayBuffer();
      return;
    } catch {
      if (Date.now() > deadline) throw new Error("the agent did not answer");
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}

// The script run as the namespace's first process: private /tmp and /home
// (the cell user's home owned by 1000:1000), then the agent as PID 1.
const INIT = [
  "set -e",
  "mount -t tmpfs -o mode=1777 sbw-tmp /tmp",
  "mount -t tmpfs -o mode=0755 sbw-home /home",
  "mkdir -p /home/cell && chown 1000:1000 /home/cell",
  'if [ -n "$3" ]; then exec "$0" -listen "tcp:127.0.0.1:$1" -cell-id "$2" -record "$3"; fi',
  'exec "$0" -listen "tcp:127.0.0.1:$1" -cell-id "$2"',
].join("\n");

/**
 * startManager serves the manager on a loopback port for the agent binary
 * at agentBin and returns {url, close, running}. With options.record, each
 * agent runs with -record (TEST ONLY: it appends every request it receives
 * to a file) and GET /containers/:cell/record returns that file.
 */
export async function startManager(agentBin, options = {}) {
  if (process.getuid && process.getuid() !== 0) throw new Error("the loopback container manager needs root");
  execFileSync("unshare", ["--mount", "--pid", "--fork", "--mount-proc", "true"]);
  // The binary is copied out of /tmp (each cell mounts its own /tmp) into a
  // directory the cell user can traverse, so the agent's helper runs.
  const dir = mkdtempSync("/var/tmp/sbw-loopback-");
  chmodSync(dir, 0o755);
  const bin = join(dir, "sandboxwich-agent");
  copyFileSync(agentBin, bin);
  chmodSync(bin, 0o755);

  const cells = new Map(); // cell → {instance, port, proc}
  const starting = new Map(); // cell → Promise

  async function start(cell) {
    const cur = cells.get(cell);
    if (cur) return cur;
    if (starting.has(cell)) return starting.get(cell);
    const p = (async () => {
      const port = await freePort();
      const record = options.record ? join(dir, `${cell}.record`) : "";
      const proc = spawn("unshare", ["--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
        "sh", "-c", INIT, bin, String(port), cell, record], {
        stdio: ["ignore", "ignore", "pipe"],
        // A container starts with the image's environment, not its host's.
        env: { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" },
      });
      let stderr = "";
      proc.stderr.on("data", (d) => { stderr = (stderr + d).slice(-4096); });
      const run = { instance: randomUUID(), port, proc };
      proc.on("exit", () => {
        if (cells.get(cell) === run) cells.delete(cell);
      });
      try {
        await waitPort(port, proc, 30_000);
      } catch (e) {
        proc.kill("SIGKILL");
        throw new Error(`${e.message}: ${stderr}`);
      }
      cells.set(cell, run);
      return run;
    })();
    starting.set(cell, p);
    try {
      return await p;
    } finally {
      starting.delete(cell);
    }
  }

  function stop(cell) {
    const run = cells.get(cell);
    if (!run) return Promise.resolve();
    cells.delete(cell);
    return new Promise((resolve) => {
      if (run.proc.exitCode !== null || run.proc.signalCode !== null) return resolve();
      run.proc.once("exit", () => resolve());
      run.proc.kill("SIGKILL");
    });
  }

  const send = (res, status, v) => {
    res.writeHead(status, { "Content-Type": "application/json" });
    res.end(JSON.stringify(v));
  };
  const server = http.createServer(async (req, res) => {
    try {
      const parts = new URL(req.url, "http://x").pathname.split("/").filter(Boolean);
      if (parts[0] !== "containers") return send(res, 404, { error: "no route" });
      if (parts.length === 1 && req.method === "GET") return send(res, 200, { cells: [...cells.keys()] });
      const cell = parts[1];
      if (!UUID_RE.test(cell ?? "")) return send(res, 422, { error: "bad cell" });
      const view = (r) => ({ instance: r.instance, port: r.port });
      if (parts.length === 2 && req.method === "GET") {
        const r = cells.get(cell);
        return r ? send(res, 200, view(r)) : send(res, 404, { error: "not running" });
      }
      if (parts.length === 2 && req.method === "DELETE") {
        await stop(cell);
        return send(res, 200, { ok: true });
      }
      if (parts[2] === "start" && req.method === "POST") return send(res, 200, view(await start(cell)));
      if (parts[2] === "record" && req.method === "GET" && options.record) {
        let data = Buffer.alloc(0);
        try {
          data = readFileSync(join(dir, `${cell}.record`));
        } catch {
          // nothing recorded yet
        }
        res.writeHead(200, { "Content-Type": "application/octet-stream" });
        return res.end(data);
      }
      if (parts[2] === "restart" && req.method === "POST") {
        await stop(cell);
        return send(res, 200, view(await start(cell)));
      }
      return send(res, 404, { error: "no route" });
    } catch (e) {
      return send(res, 500, { error: String(e && e.message) });
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${server.address().port}`;
  return {
    url,
    running: () => [...cells.keys()],
    async close() {
      await Promise.all([...cells.keys()].map(stop));
      await new Promise((resolve) => server.close(resolve));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** buildAgent builds cmd/sandboxwich-agent (static) into dir and returns its path. */
export function buildAgent(repoRoot, dir) {
  const out = join(dir, "sandboxwich-agent");
  execFileSync("go", ["build", "-o", out, "./cmd/sandboxwich-agent"], {
    cwd: repoRoot,
    env: { ...process.env, CGO_ENABLED: "0" },
    stdio: ["ignore", "inherit", "inherit"],
  });
  return out;
}
