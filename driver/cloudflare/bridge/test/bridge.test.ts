// The bridge in real workerd, with the real cell agent behind each cell's
// Durable Object (test/loopback.ts, test/manager.mjs).

import { SELF } from "cloudflare:test";
import { describe, expect, inject, it } from "vitest";
import "./provided.js";

const TOKEN = "test-token-0123456789abcdef0123456789abcdef";
const skip = inject("skipReason");
const manager = inject("managerURL");
const POOL = "inst-test:pool-a";

const auth = { Authorization: `Bearer ${TOKEN}` };

function call(path: string, init: RequestInit = {}): Promise<Response> {
  return SELF.fetch(`https://bridge.test${path}`, { ...init, headers: { ...auth, ...(init.headers as Record<string, string> | undefined) } });
}

async function body(r: Response): Promise<Record<string, unknown>> {
  return (await r.json()) as Record<string, unknown>;
}

interface Cell {
  id: string;
  identity: string;
}

async function create(id = crypto.randomUUID()): Promise<Cell> {
  const r = await call("/v1/cells", { method: "POST", body: JSON.stringify({ cell_id: id, pool: POOL }) });
  const b = await body(r);
  expect(r.status, JSON.stringify(b)).toBe(201);
  expect(b["state"]).toBe("waiting");
  const cell = { id, identity: b["identity"] as string };
  await waitReady(cell);
  return cell;
}

async function waitReady(c: Cell): Promise<Record<string, unknown>> {
  for (let i = 0; i < 300; i++) {
    const b = await body(await call(`/v1/cells/${c.id}`));
    if (b["ready"] === true) return b;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("the cell never became ready");
}

function agentCall(c: Cell, path: string, v: unknown, query = ""): Promise<Response> {
  return call(`/v1/cells/${c.id}/agent/v1/${path}${query}`, {
    method: v === undefined ? "GET" : "POST",
    headers: { "X-Sandboxwich-Identity": c.identity, "Content-Type": "application/json" },
    body: v === undefined ? null : JSON.stringify(v),
  });
}

function activation(c: Cell, lease = crypto.randomUUID(), ttl = 3_600_000) {
  return {
    version: 1,
    cell_id: c.id,
    lease_id: lease,
    generation: 1,
    expires_at: new Date(Date.now() + ttl).toISOString(),
    ttl_ms: ttl,
  };
}

function fenceOf(a: ReturnType<typeof activation>) {
  return { cell_id: a.cell_id, lease_id: a.lease_id, generation: a.generation };
}

async function destroy(c: Cell): Promise<void> {
  const r = await call(`/v1/cells/${c.id}`, { method: "DELETE", headers: { "X-Sandboxwich-Identity": c.identity } });
  expect(r.status).toBe(200);
  await r.body?.cancel();
}

async function running(): Promise<string[]> {
  const r = await fetch(`${manager}/containers`);
  return ((await r.json()) as { cells: string[] }).cells;
}

describe.skipIf(skip !== "")("bridge", () => {
  describe("bearer token", () => {
    it("refuses a missing, wrong, malformed or differently long token", async () => {
      const headers: Record<string, string>[] = [
        {},
        { Authorization: "Bearer wrong" },
        { Authorization: `Bearer ${TOKEN}x` },
        { Authorization: `Bearer ${TOKEN.slice(0, -1)}` },
        { Authorization: `Basic ${TOKEN}` },
        { Authorization: `Bearer  ${TOKEN}` },
        { Authorization: `bearer ${TOKEN}` },
      ];
      for (const h of headers) {
        const r = await SELF.fetch("https://bridge.test/v1/bridge", { headers: h });
        expect(r.status, JSON.stringify(h)).toBe(401);
        const b = await body(r);
        expect(b["code"]).toBe("unauthorized");
        expect(JSON.stringify(b)).not.toContain(TOKEN);
        expect(r.headers.get("X-Sandboxwich-Bridge-Error")).toBe("unauthorized");
      }
      // Nothing is created without the token.
      const id = crypto.randomUUID();
      const r = await SELF.fetch("https://bridge.test/v1/cells", { method: "POST", body: JSON.stringify({ cell_id: id, pool: POOL }) });
      expect(r.status).toBe(401);
      await r.body?.cancel();
      expect((await body(await call(`/v1/cells/${id}`)))["code"]).toBe("cell_not_found");
    });

    it("reports the bridge's identity with the right token", async () => {
      const r = await call("/v1/bridge");
      expect(r.status).toBe(200);
      const b = await body(r);
      expect(b).toEqual({
        bridge_version: "0.1.0",
        container_class: "CellObject",
        image: "registry.example/sandboxwich-cell@sha256:" + "a".repeat(64),
        instance_type: "basic",
      });
    });
  });

  describe("bad input", () => {
    it("refuses bad creates with invalid_request and creates nothing", async () => {
      const id = crypto.randomUUID();
      for (const b of [
        "not json",
        JSON.stringify({ cell_id: "not-a-uuid", pool: POOL }),
        JSON.stringify({ cell_id: id.toUpperCase(), pool: POOL }),
        JSON.stringify({ cell_id: id, pool: "" }),
        JSON.stringify({ cell_id: id, pool: "a b" }),
        JSON.stringify({ cell_id: id, pool: POOL, extra: 1 }),
        JSON.stringify([id]),
      ]) {
        const r = await call("/v1/cells", { method: "POST", body: b });
        expect(r.status, b).toBe(422);
        expect((await body(r))["code"]).toBe("invalid_request");
      }
      expect((await body(await call(`/v1/cells/${id}`)))["code"]).toBe("cell_not_found");
      const r = await call("/v1/cells/not-a-uuid");
      expect(r.status).toBe(422);
      await r.body?.cancel();
    });

    it("refuses an activation carrying anything beyond the sanitized fields, and stays waiting", async () => {
      const c = await create();
      const a = activation(c);
      for (const bad of [
        { ...a, attestation: "sbw1.secret" },
        { ...a, organization: "o", workspace: "w" },
        { ...a, token: "t" },
        { ...a, version: 2 },
        { ...a, ttl_ms: 0 },
        { ...a, generation: 0 },
        { ...a, expires_at: "tomorrow" },
        { ...a, lease_id: "x" },
      ]) {
        const r = await agentCall(c, "activate", bad);
        expect(r.status, JSON.stringify(bad)).toBe(422);
        expect((await body(r))["code"]).toBe("invalid_request");
      }
      for (const bad of [
        { ...fenceOf(a), argv: ["true"], activation: { ...a, attestation: "x" } },
        { ...fenceOf(a), argv: [] },
        { ...fenceOf(a), argv: ["true"], cwd: "relative" },
        { ...fenceOf(a), argv: ["true"], user: "nobody" },
        { ...fenceOf(a), argv: ["true"], env: { "A=B": "c" } },
        { ...fenceOf(a), argv: ["true"], stdin: "***" },
        { ...fenceOf(a), argv: ["true"], secret: 1 },
        { ...fenceOf(a), argv: ["true"], activation: activation(c) }, // another fence than the request's
      ]) {
        const r = await agentCall(c, "exec", bad, "?collect=1");
        expect(r.status, JSON.stringify(bad)).toBe(422);
        await r.body?.cancel();
      }
      const st = await body(await call(`/v1/cells/${c.id}`));
      expect(st["state"]).toBe("waiting");
      expect((st["agent"] as Record<string, unknown>)["activations"]).toBe(0);
      // A wrong identity reaches nothing.
      const r = await call(`/v1/cells/${c.id}/agent/v1/status`, { headers: { "X-Sandboxwich-Identity": crypto.randomUUID() } });
      expect(r.status).toBe(404);
      await r.body?.cancel();
      await destroy(c);
    });
  });

  describe("one-shot state", () => {
    it("creates idempotently, activates once, replays, refuses a conflicting fence, and never goes back", async () => {
      const c = await create();
      const again = await call("/v1/cells", { method: "POST", body: JSON.stringify({ cell_id: c.id, pool: POOL }) });
      expect(again.status).toBe(200);
      expect((await body(again))["identity"]).toBe(c.identity);
      const other = await call("/v1/cells", { method: "POST", body: JSON.stringify({ cell_id: c.id, pool: "another-pool" }) });
      expect(other.status).toBe(409);
      expect((await body(other))["code"]).toBe("pool_mismatch");

      const st = await waitReady(c);
      expect(st).toMatchObject({
        cell_id: c.id, identity: c.identity, pool: POOL, state: "waiting", ready: true,
        image: "registry.example/sandboxwich-cell@sha256:" + "a".repeat(64), instance_type: "basic",
        bridge_version: "0.1.0", backend: "loopback-test",
      });
      expect(st["agent"]).toMatchObject({ state: "waiting", activations: 0, cell_id: c.id });
      expect((st["agent"] as Record<string, string>)["digest"]).toMatch(/^sha256:[0-9a-f]{64}$/);

      const a = activation(c);
      const f = fenceOf(a);
      // Nothing runs before activation.
      let r = await agentCall(c, "exec", { ...f, argv: ["true"] }, "?collect=1");
      expect(r.status).toBe(409);
      expect((await body(r))["code"]).toBe("not_active");

      r = await agentCall(c, "activate", a);
      expect(r.status).toBe(200);
      await r.body?.cancel();
      r = await agentCall(c, "activate", a); // exact replay
      expect(r.status).toBe(200);
      await r.body?.cancel();
      const b = activation(c);
      r = await agentCall(c, "activate", b);
      expect(r.status).toBe(409);
      expect((await body(r))["code"]).toBe("fence_refused");
      r = await agentCall(c, "exec", { ...fenceOf(b), activation: b, argv: ["true"] }, "?collect=1");
      expect(r.status).toBe(409);
      await r.body?.cancel();

      const s2 = await body(await call(`/v1/cells/${c.id}`));
      expect(s2["state"]).toBe("active");
      expect(s2["agent"]).toMatchObject({ state: "active", activations: 1 });

      // Exec, streamed as NDJSON frames.
      r = await agentCall(c, "exec", { ...f, activation: a, argv: ["sh", "-c", "echo out; echo err >&2; exit 3"] });
      expect(r.status).toBe(200);
      expect(r.headers.get("Content-Type")).toBe("application/x-ndjson");
      const frames = new TextDecoder().decode(await r.arrayBuffer()).trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
      const result = frames.at(-1)!["result"] as Record<string, unknown>;
      expect(result["exit_code"]).toBe(3);
      const streamed = frames.filter((x) => x["stream"]).map((x) => `${x["stream"]}:${atob(x["data"] as string)}`);
      expect(streamed.sort()).toEqual(["stderr:err\n", "stdout:out\n"]);

      // Files: written through the bridge, read back byte-exact.
      const content = new Uint8Array(300_000).map((_, i) => (i * 7) & 0xff);
      const header = new TextEncoder().encode(JSON.stringify({ ...f, path: "/home/cell/d/f.bin", mode: 0o600 }) + "\n");
      // The content in the agent's frames: its length (4 bytes,
      // big-endian), the bytes, then the end frame of length 0.
      const up = new Uint8Array(header.length + 4 + content.length + 4);
      up.set(header);
      new DataView(up.buffer).setUint32(header.length, content.length);
      up.set(content, header.length + 4);
      r = await call(`/v1/cells/${c.id}/agent/v1/files/write`, {
        method: "POST", headers: { "X-Sandboxwich-Identity": c.identity, "Content-Type": "application/octet-stream" }, body: up,
      });
      const info = await body(r);
      expect(r.status, JSON.stringify(info)).toBe(200);
      expect(info["size"]).toBe(content.length);
      r = await agentCall(c, "files/read", { ...f, path: "/home/cell/d/f.bin" });
      expect(r.status).toBe(200);
      expect(new Uint8Array(await r.arrayBuffer())).toEqual(content);
      r = await agentCall(c, "files/read", { ...f, path: "/home/cell/missing" });
      expect(r.status).toBe(404);
      expect((await body(r))["code"]).toBe("file_not_found");

      // Launch, its replay and its status.
      const launch = { ...f, argv: ["sh", "-c", "echo launched"] };
      r = await agentCall(c, "launch", launch);
      expect(r.status).toBe(200);
      await r.body?.cancel();
      r = await agentCall(c, "launch", launch);
      expect((await body(r))["replay"]).toBe(true);
      r = await agentCall(c, "launch/status", f);
      expect(r.status).toBe(200);
      await r.body?.cancel();

      // Release with another fence is refused; with its own, the cell ends for good.
      r = await agentCall(c, "release", fenceOf(b));
      expect(r.status).toBe(409);
      await r.body?.cancel();
      r = await agentCall(c, "release", f);
      expect(r.status).toBe(200);
      await r.body?.cancel();
      r = await agentCall(c, "release", f); // again: still succeeds
      expect(r.status).toBe(200);
      await r.body?.cancel();
      r = await agentCall(c, "exec", { ...f, activation: a, argv: ["true"] }, "?collect=1");
      expect(r.status).toBe(410);
      expect((await body(r))["code"]).toBe("expired");
      r = await agentCall(c, "activate", activation(c));
      expect(r.status).toBe(409);
      await r.body?.cancel();
      const s3 = await body(await call(`/v1/cells/${c.id}`));
      expect(s3).toMatchObject({ state: "ended", ended_reason: "released", ready: false });
      await destroy(c);
    });

    it("ends the cell at ttl_ms by the object's clock", async () => {
      const c = await create();
      const a = activation(c, crypto.randomUUID(), 300);
      let r = await agentCall(c, "activate", a);
      expect(r.status).toBe(200);
      await r.body?.cancel();
      await new Promise((res) => setTimeout(res, 600));
      r = await agentCall(c, "exec", { ...fenceOf(a), argv: ["true"] }, "?collect=1");
      expect(r.status).toBe(410);
      await r.body?.cancel();
      expect((await body(await call(`/v1/cells/${c.id}`)))["state"]).toBe("ended");
      await destroy(c);
    });
  });

  describe("exec cancellation", () => {
    it("aborts a named exec on agent-cancel: the agent kills the command", async () => {
      const c = await create();
      const a = activation(c);
      const f = fenceOf(a);
      const secs = 600 + Math.floor(Math.random() * 300);
      const rid = crypto.randomUUID();
      const pending = call(`/v1/cells/${c.id}/agent/v1/exec`, {
        method: "POST",
        headers: { "X-Sandboxwich-Identity": c.identity, "X-Sandboxwich-Request": rid },
        body: JSON.stringify({ ...f, activation: a, argv: ["sh", "-c", `echo started; exec sleep ${secs}`] }),
      });
      const ps = async (): Promise<string> => {
        const r = await agentCall(c, "exec", { ...f, argv: ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"] }, "?collect=1");
        const res = (await body(r))["result"] as Record<string, string> | undefined;
        return res ? atob(res["stdout"] ?? "") : "";
      };
      // Wait until the command runs.
      for (let i = 0; !(await ps()).includes(`sleep ${secs}`); i++) {
        if (i > 200) throw new Error("the command never ran");
        await new Promise((r) => setTimeout(r, 50));
      }
      const cr = await call(`/v1/cells/${c.id}/agent-cancel`, { method: "POST", body: JSON.stringify({ request_id: rid }) });
      expect(await body(cr)).toEqual({ cancelled: true });
      const resp = await pending;
      await resp.arrayBuffer().catch(() => undefined); // ends: cut off or with the agent's last frame
      for (let i = 0; (await ps()).includes(`sleep ${secs}`); i++) {
        if (i > 200) throw new Error("the cancelled command still runs");
        await new Promise((r) => setTimeout(r, 50));
      }
      const again = await call(`/v1/cells/${c.id}/agent-cancel`, { method: "POST", body: JSON.stringify({ request_id: rid }) });
      expect(await body(again)).toEqual({ cancelled: false });
      const bad = await call(`/v1/cells/${c.id}/agent-cancel`, { method: "POST", body: JSON.stringify({ request_id: "x" }) });
      expect(bad.status).toBe(422);
      await bad.body?.cancel();
      await destroy(c);
    });
  });

  describe("container restart", () => {
    it("ends the cell with cell_lost, and a replayed activation cannot revive it", async () => {
      const c = await create();
      const a = activation(c);
      let r = await agentCall(c, "exec", { ...fenceOf(a), activation: a, argv: ["true"] }, "?collect=1");
      expect(r.status).toBe(200);
      await r.body?.cancel();
      // The container restarts behind the object: its new agent would be waiting.
      const rr = await fetch(`${manager}/containers/${c.id}/restart`, { method: "POST" });
      expect(rr.status).toBe(200);
      await rr.body?.cancel();
      r = await agentCall(c, "exec", { ...fenceOf(a), activation: a, argv: ["true"] }, "?collect=1");
      expect(r.status).toBe(409);
      expect(r.headers.get("X-Sandboxwich-Bridge-Error")).toBe("cell_lost");
      expect((await body(r))["code"]).toBe("cell_lost");
      r = await agentCall(c, "activate", a);
      expect((await body(r))["code"]).toBe("cell_lost");
      const st = await body(await call(`/v1/cells/${c.id}`));
      expect(st).toMatchObject({ state: "ended", ended_reason: "cell_lost", ready: false });
      await destroy(c);
    });

    it("ends a waiting cell whose container stopped", async () => {
      const c = await create();
      const rr = await fetch(`${manager}/containers/${c.id}`, { method: "DELETE" });
      await rr.body?.cancel();
      const r = await agentCall(c, "status", undefined);
      expect((await body(r))["code"]).toBe("cell_lost");
      await destroy(c);
    });
  });

  describe("delete and listing", () => {
    it("lists the pool's cells, deletes with a read-back of absence, and never reuses the ID", async () => {
      const c = await create();
      let list = await body(await call(`/v1/cells?pool=${encodeURIComponent(POOL)}`));
      expect(list["cells"]).toContain(c.id);
      list = await body(await call("/v1/cells?pool=another-pool"));
      expect(list["cells"]).not.toContain(c.id);

      let r = await call(`/v1/cells/${c.id}`, { method: "DELETE", headers: { "X-Sandboxwich-Identity": crypto.randomUUID() } });
      expect(r.status).toBe(409);
      expect(await body(r)).toMatchObject({ code: "identity_mismatch", identity: c.identity });
      expect(await running()).toContain(c.id);

      r = await call(`/v1/cells/${c.id}`, { method: "DELETE", headers: { "X-Sandboxwich-Identity": c.identity } });
      expect(r.status).toBe(200);
      expect(await body(r)).toEqual({ cell_id: c.id, absent: true, identity: c.identity });
      expect(await running()).not.toContain(c.id);
      const st = await call(`/v1/cells/${c.id}`);
      expect(st.status).toBe(404);
      expect(await body(st)).toMatchObject({ code: "cell_not_found", deleted: true, identity: c.identity });
      list = await body(await call(`/v1/cells?pool=${encodeURIComponent(POOL)}`));
      expect(list["cells"]).not.toContain(c.id);
      r = await call(`/v1/cells/${c.id}`, { method: "DELETE" }); // absent: still proven
      expect(r.status).toBe(200);
      expect((await body(r))["absent"]).toBe(true);
      r = await agentCall(c, "status", undefined);
      expect(r.status).toBe(404);
      await r.body?.cancel();
      r = await call("/v1/cells", { method: "POST", body: JSON.stringify({ cell_id: c.id, pool: POOL }) });
      expect(r.status).toBe(409);
      expect((await body(r))["code"]).toBe("cell_deleted");
      list = await body(await call(`/v1/cells?pool=${encodeURIComponent(POOL)}`));
      expect(list["cells"]).not.toContain(c.id);
    });

    it("closes a never-created cell ID on delete, so a create still in flight makes nothing", async () => {
      const id = crypto.randomUUID();
      let r = await call(`/v1/cells/${id}`, { method: "DELETE" });
      expect(r.status).toBe(200);
      expect(await body(r)).toEqual({ cell_id: null, absent: true, identity: null });
      r = await call("/v1/cells", { method: "POST", body: JSON.stringify({ cell_id: id, pool: POOL }) });
      expect(r.status).toBe(409);
      expect((await body(r))["code"]).toBe("cell_deleted");
      expect(await running()).not.toContain(id);
      const list = await body(await call(`/v1/cells?pool=${encodeURIComponent(POOL)}`));
      expect(list["cells"]).not.toContain(id);
    });
  });
});
