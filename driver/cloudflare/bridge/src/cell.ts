// The Durable Object of one cell: the control side of CONTRACT §13 inside
// Cloudflare. It holds the cell's one-shot state (waiting → active bound to
// one fence → ended, never back) in durable storage, starts the cell's
// container once, and forwards the agent protocol to it after validating
// every request against that state.

import { DurableObject } from "cloudflare:workers";
import { CloudflareContainer, type CellContainer, type Instance } from "./container.js";
import type { Env } from "./env.js";
import { json, refuse } from "./errors.js";
import * as v from "./validate.js";
import { BRIDGE_VERSION } from "./version.js";

/** The one-shot states (agent.State). */
export type CellState = "waiting" | "active" | "ended";

/** Why an ended cell ended. */
export type EndReason = "released" | "expired" | "cell_lost" | "deleted";

/** The durable record of a cell. */
export interface CellRecord {
  cell_id: string;
  /** identity names this object; a later one under the same cell ID (none is made) would differ. */
  identity: string;
  pool: string;
  created_at: string;
  state: CellState;
  ended_reason?: EndReason;
  activation?: v.Activation;
  /** activated_at_ms is the object's clock at activation: it enforces ttl_ms from there. */
  activated_at_ms?: number;
  /** instance is the container instance started for the cell (once). */
  instance?: Instance;
  image: string;
  instance_type: string;
  container_class: string;
}

/** A tombstone stays where a deleted cell was: the ID is never used again. */
interface Tombstone {
  cell_id: string;
  identity: string;
  deleted_at: string;
}

const RECORD = "cell";
const TOMBSTONE = "tombstone";

/** How long a status probe and a deletion's read-back wait. */
const PROBE_TIMEOUT_MS = 5_000;
const DELETE_READBACK_MS = 10_000;

export const IDENTITY_HEADER = "X-Sandboxwich-Identity";

/**
 * REQUEST_HEADER names an exec request so that the driver can cancel it
 * (POST /v1/cells/:id/agent-cancel): a client's disconnect does not reach
 * the Durable Object's subrequest to the container on its own.
 */
export const REQUEST_HEADER = "X-Sandboxwich-Request";

export class CellObject extends DurableObject<Env> {
  private rec: CellRecord | undefined;
  private tomb: Tombstone | undefined;
  /** lifecycle serializes create and delete: a delete waits for a create's container start. */
  private lifecycle: Promise<unknown> = Promise.resolve();

  /** inflight holds the abort of every exec forwarded to the container, by request ID. */
  private readonly inflight = new Map<string, AbortController>();

  private serialized<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.lifecycle.then(fn, fn);
    this.lifecycle = run.catch(() => undefined);
    return run;
  }
  protected readonly container: CellContainer;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.container = this.makeContainer(ctx, env);
    void ctx.blockConcurrencyWhile(async () => {
      this.rec = await ctx.storage.get<CellRecord>(RECORD);
      this.tomb = await ctx.storage.get<Tombstone>(TOMBSTONE);
    });
  }

  /** makeContainer returns the cell's container; tests override it. */
  protected makeContainer(ctx: DurableObjectState, _env: Env): CellContainer {
    return new CloudflareContainer(ctx, async () => (await ctx.storage.get<CellRecord>(RECORD))?.instance?.id ?? null);
  }

  private async save(rec: CellRecord): Promise<void> {
    this.rec = rec;
    await this.ctx.storage.put(RECORD, rec);
  }

  override async fetch(req: Request): Promise<Response> {
    const url = new URL(req.url);
    try {
      if (url.pathname === "/create" && req.method === "POST") {
        const body = await req.json();
        return await this.serialized(() => this.create(body));
      }
      if (url.pathname === "/status" && req.method === "GET") return await this.status();
      if (url.pathname === "/delete" && req.method === "POST") {
        const identity = req.headers.get(IDENTITY_HEADER);
        return await this.serialized(() => this.delete(identity));
      }
      if (url.pathname.startsWith("/agent/")) return await this.agent(req, url.pathname.slice("/agent".length), url.search);
      if (url.pathname === "/cancel" && req.method === "POST") {
        const b = (await readJSON(req)) as Record<string, unknown> | null;
        const id = v.uuid(b?.["request_id"], "request_id");
        const ac = this.inflight.get(id);
        ac?.abort();
        this.inflight.delete(id);
        return json(200, { cancelled: ac !== undefined });
      }
      return refuse("not_found", "no such route");
    } catch (e) {
      if (e instanceof v.Invalid) return refuse("invalid_request", e.message);
      return refuse("internal", "the bridge failed: " + (e instanceof Error ? e.name : "error"));
    }
  }

  /** view is the record as the status route reports it. */
  private view(rec: CellRecord, extra: Record<string, unknown> = {}): Record<string, unknown> {
    return {
      cell_id: rec.cell_id,
      identity: rec.identity,
      pool: rec.pool,
      created_at: rec.created_at,
      state: rec.state,
      ended_reason: rec.ended_reason ?? null,
      started: rec.instance !== undefined,
      image: rec.image,
      instance_type: rec.instance_type,
      container_class: rec.container_class,
      backend: this.container.backend,
      bridge_version: BRIDGE_VERSION,
      ...extra,
    };
  }

  private async create(raw: unknown): Promise<Response> {
    const body = v.createRequest(raw);
    if (this.tomb !== undefined) {
      return refuse("cell_deleted", "this cell ID was deleted and is never used again", { identity: this.tomb.identity || null });
    }
    let rec = this.rec;
    if (rec !== undefined && rec.pool !== body.pool) {
      return refuse("pool_mismatch", "the cell exists in another pool");
    }
    let created = false;
    if (rec === undefined) {
      rec = {
        cell_id: body.cell_id,
        identity: crypto.randomUUID(),
        pool: body.pool,
        created_at: new Date().toISOString(),
        state: "waiting",
        image: this.env.CELL_IMAGE,
        instance_type: this.env.CELL_INSTANCE_TYPE,
        container_class: this.env.CONTAINER_CLASS,
      };
      await this.save(rec);
      created = true;
    }
    if (rec.instance === undefined && rec.state === "waiting") {
      // The container starts once: a record with an instance never starts another.
      let inst: Instance;
      try {
        inst = await this.container.start(rec.cell_id);
      } catch {
        return refuse("container_unavailable", "the container did not start");
      }
      await this.save({ ...rec, instance: inst });
      rec = this.rec!;
    }
    return json(created ? 201 : 200, this.view(rec));
  }

  /**
   * alive checks that the instance the cell started with still runs; a
   * restart or a stop ends the cell (cell_lost), for good.
   */
  private async alive(rec: CellRecord): Promise<boolean> {
    if (rec.state === "ended" && rec.ended_reason === "cell_lost") return false;
    if (rec.instance === undefined) return true; // never started: nothing to lose yet
    const cur = await this.container.current();
    if (cur !== null && cur.id === rec.instance.id) return true;
    const now = this.rec!;
    if (now.identity === rec.identity && !(now.state === "ended" && now.ended_reason === "deleted")) {
      await this.save({ ...now, state: "ended", ended_reason: "cell_lost" });
    }
    return false;
  }

  private async status(): Promise<Response> {
    const rec = this.rec;
    if (rec === undefined) {
      return refuse("cell_not_found", "no such cell", this.tomb ? { deleted: true, identity: this.tomb.identity || null } : { deleted: false });
    }
    if (rec.instance === undefined) return json(200, this.view(rec, { ready: false, agent: null }));
    if (!(await this.alive(rec))) return json(200, this.view(this.rec!, { ready: false, agent: null }));
    let agent: unknown = null;
    let ready = false;
    try {
      const r = await this.container.fetch("/v1/status", { method: "GET", signal: AbortSignal.timeout(PROBE_TIMEOUT_MS) });
      if (r.status === 200) {
        const st = (await r.json()) as Record<string, unknown>;
        agent = {
          state: st["state"],
          activations: st["activations"],
          cell_id: st["cell_id"],
          digest: st["digest"],
        };
        ready = st["cell_id"] === rec.cell_id && this.rec!.state !== "ended";
      } else {
        await r.body?.cancel();
      }
    } catch {
      // not answering yet: not ready
    }
    return json(200, this.view(this.rec!, { ready, agent }));
  }

  private async delete(identity: string | null): Promise<Response> {
    const rec = this.rec;
    if (rec === undefined) {
      // Deleting a cell never created closes its ID too: a create still in
      // flight (its caller gave up) must not make the object afterwards.
      if (this.tomb === undefined) {
        const tomb: Tombstone = { cell_id: "", identity: "", deleted_at: new Date().toISOString() };
        await this.ctx.storage.put(TOMBSTONE, tomb);
        this.tomb = tomb;
      }
      return json(200, { cell_id: null, absent: true, identity: this.tomb.identity === "" ? null : this.tomb.identity });
    }
    if (identity !== null && identity !== "" && identity !== rec.identity) {
      return refuse("identity_mismatch", "the cell ID belongs to another identity", { identity: rec.identity });
    }
    // Ended first: no request reaches the container from here on.
    await this.save({ ...rec, state: "ended", ended_reason: "deleted" });
    await this.container.destroy();
    const deadline = Date.now() + DELETE_READBACK_MS;
    while ((await this.container.current()) !== null) {
      if (Date.now() > deadline) return refuse("deletion_unconfirmed", "the container still runs after destroy");
      await new Promise((r) => setTimeout(r, 100));
    }
    const tomb: Tombstone = { cell_id: rec.cell_id, identity: rec.identity, deleted_at: new Date().toISOString() };
    await this.ctx.storage.put(TOMBSTONE, tomb);
    await this.ctx.storage.delete(RECORD);
    this.tomb = tomb;
    this.rec = undefined;
    return json(200, { cell_id: rec.cell_id, absent: true, identity: rec.identity });
  }

  /** expireIfDue ends an active cell whose ttl_ms has passed by the object's clock. */
  private async expireIfDue(): Promise<void> {
    const rec = this.rec!;
    if (rec.state === "active" && rec.activation && rec.activated_at_ms !== undefined &&
        Date.now() >= rec.activated_at_ms + rec.activation.ttl_ms) {
      await this.save({ ...rec, state: "ended", ended_reason: "expired" });
    }
  }

  /**
   * admit applies a lease request's fence (and activation) to the one-shot
   * state: null admits it, a Response refuses it. The state changes here,
   * before anything reaches the container, and synchronously after the
   * last await, so two requests cannot both bind a waiting cell.
   */
  private async admit(f: v.Fence, a: v.Activation | undefined, op: string): Promise<Response | null> {
    await this.expireIfDue();
    const rec = this.rec!;
    if (f.cell_id !== rec.cell_id) return refuse("fence_refused", "the fence names another cell");
    if (rec.state === "ended") {
      if (op === "/v1/release" && rec.activation && v.sameFence(rec.activation, f)) return null;
      if (rec.activation && !v.sameFence(rec.activation, f)) return refuse("fence_refused", "the cell is bound to another fence");
      return refuse("expired", "the lease ended; the cell ended");
    }
    if (rec.state === "waiting") {
      if (a === undefined) return refuse("not_active", "the cell agent is not activated");
      await this.save({ ...rec, state: "active", activation: a, activated_at_ms: Date.now() });
      return null;
    }
    const bound = rec.activation!;
    if (a !== undefined && !v.sameActivation(bound, a)) return refuse("fence_refused", "the cell is bound to another activation");
    if (!v.sameFence(bound, f)) return refuse("fence_refused", "the cell is bound to another fence");
    return null;
  }

  private async agent(req: Request, op: string, search: string): Promise<Response> {
    const rec = this.rec;
    if (rec === undefined || rec.identity !== req.headers.get(IDENTITY_HEADER)) {
      return refuse("cell_not_found", "no such cell");
    }
    if (rec.state === "ended" && rec.ended_reason === "deleted") return refuse("cell_not_found", "the cell is being deleted");
    if (rec.instance === undefined) return refuse("container_unavailable", "the cell's container has not started");
    if (!(await this.alive(rec))) return refuse("cell_lost", "the cell's container stopped or restarted: the cell ended");

    let body: BodyInit | null = null;
    let fence: v.Fence | undefined;
    let act: v.Activation | undefined;
    let query = "";
    switch (`${req.method} ${op}`) {
      case "GET /v1/status":
        return this.forward(op, { method: "GET" }, req.signal);
      case "POST /v1/activate": {
        act = v.activation(await readJSON(req));
        fence = act;
        body = JSON.stringify(act);
        break;
      }
      case "POST /v1/release":
      case "POST /v1/launch/status": {
        fence = v.fence(await readJSON(req));
        body = JSON.stringify(fence);
        break;
      }
      case "POST /v1/exec": {
        const r = v.execRequest(await readJSON(req));
        ({ fence, activation: act } = r);
        body = JSON.stringify(r.body);
        const q = new URLSearchParams(search);
        if (q.get("collect") === "1") query = "?collect=1";
        break;
      }
      case "POST /v1/launch": {
        const r = v.launchRequest(await readJSON(req));
        ({ fence, activation: act } = r);
        body = JSON.stringify(r.body);
        break;
      }
      case "POST /v1/files/read": {
        const r = v.readRequest(await readJSON(req));
        ({ fence, activation: act } = r);
        body = JSON.stringify(r.body);
        break;
      }
      case "POST /v1/files/write": {
        if (req.body === null) throw new v.Invalid("files/write: no body");
        const { header, rest } = await splitHeader(req.body);
        const r = v.writeRequest(parseJSON(header));
        ({ fence, activation: act } = r);
        body = prepend(new TextEncoder().encode(JSON.stringify(r.body) + "\n"), rest);
        break;
      }
      default:
        return refuse("not_found", "no such agent route");
    }
    const refused = await this.admit(fence, act, op);
    if (refused !== null) {
      // The rest of the body is read, not cancelled: the client's
      // connection stays usable for its next request.
      if (body instanceof ReadableStream) await drainStream(body);
      return refused;
    }
    let signal = req.signal;
    const reqID = op === "/v1/exec" ? req.headers.get(REQUEST_HEADER) : null;
    let done = (): void => {};
    if (reqID !== null && reqID !== "") {
      const id = v.uuid(reqID, REQUEST_HEADER);
      const ac = new AbortController();
      this.inflight.set(id, ac);
      signal = AbortSignal.any([req.signal, ac.signal]);
      done = () => {
        if (this.inflight.get(id) === ac) this.inflight.delete(id);
      };
    }
    let resp = await this.forward(op + query, { method: "POST", body, headers: { "Content-Type": "application/json" } }, signal);
    if (resp.body !== null && reqID !== null) {
      const end = done;
      resp = new Response(resp.body.pipeThrough(new TransformStream<Uint8Array, Uint8Array>({ flush: end })), resp);
    } else {
      done();
    }
    if (resp.status === 200 && op === "/v1/release") {
      const cur = this.rec!;
      if (cur.state === "active") await this.save({ ...cur, state: "ended", ended_reason: "released" });
    }
    if (resp.status === 410) {
      const cur = this.rec!;
      if (cur.state === "active") await this.save({ ...cur, state: "ended", ended_reason: "expired" });
    }
    return resp;
  }

  /** forward sends one request to the agent and hands its answer back as it streams. */
  private async forward(path: string, init: RequestInit, signal: AbortSignal): Promise<Response> {
    let resp: Response;
    try {
      resp = await this.container.fetch(path, { ...init, signal });
    } catch {
      const rec = this.rec;
      if (rec !== undefined && !(await this.alive(rec))) return refuse("cell_lost", "the cell's container stopped: the cell ended");
      return refuse("container_unavailable", "the cell agent did not answer");
    }
    const headers = new Headers();
    for (const h of ["Content-Type", "Content-Length"]) {
      const val = resp.headers.get(h);
      if (val !== null) headers.set(h, val);
    }
    return new Response(resp.body, { status: resp.status, headers });
  }
}

async function readJSON(req: Request): Promise<unknown> {
  const len = req.headers.get("Content-Length");
  if (len !== null && Number(len) > v.MAX_JSON_BODY) throw new v.Invalid("the request body is too large");
  const text = await readBounded(req.body, v.MAX_JSON_BODY);
  return parseJSON(text);
}

function parseJSON(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new v.Invalid("the request body is not JSON");
  }
}

async function readBounded(body: ReadableStream<Uint8Array> | null, max: number): Promise<string> {
  if (body === null) return "";
  const reader = body.getReader();
  const chunks: Uint8Array[] = [];
  let n = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    n += value.byteLength;
    if (n > max) {
      await reader.cancel();
      throw new v.Invalid("the request body is too large");
    }
    chunks.push(value);
  }
  const all = new Uint8Array(n);
  let off = 0;
  for (const c of chunks) {
    all.set(c, off);
    off += c.byteLength;
  }
  return new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(all);
}

const MAX_HEADER_LINE = 64 << 10;

/** splitHeader reads a file write's first line (bounded) and returns it and the rest of the stream. */
async function splitHeader(body: ReadableStream<Uint8Array>): Promise<{ header: string; rest: ReadableStream<Uint8Array> }> {
  const reader = body.getReader();
  let buf = new Uint8Array(0);
  for (;;) {
    const nl = buf.indexOf(10);
    if (nl >= 0) {
      const header = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(buf.subarray(0, nl));
      const first = buf.subarray(nl + 1);
      const rest = new ReadableStream<Uint8Array>({
        start(c) {
          if (first.byteLength > 0) c.enqueue(first);
        },
        async pull(c) {
          const { done, value } = await reader.read();
          if (done) c.close();
          else c.enqueue(value);
        },
        cancel(reason) {
          return reader.cancel(reason);
        },
      });
      return { header, rest };
    }
    if (buf.byteLength > MAX_HEADER_LINE) {
      await reader.cancel();
      throw new v.Invalid("files/write: the header line is too long");
    }
    const { done, value } = await reader.read();
    if (done) throw new v.Invalid("files/write: the body ended before the header line did");
    const next = new Uint8Array(buf.byteLength + value.byteLength);
    next.set(buf);
    next.set(value, buf.byteLength);
    buf = next;
  }
}

/** drainStream reads a stream to its end, discarding it. */
async function drainStream(s: ReadableStream<Uint8Array>): Promise<void> {
  const reader = s.getReader();
  for (;;) {
    const { done } = await reader.read();
    if (done) return;
  }
}

/** prepend returns a stream of head followed by rest. */
function prepend(head: Uint8Array, rest: ReadableStream<Uint8Array>): ReadableStream<Uint8Array> {
  const reader = rest.getReader();
  return new ReadableStream<Uint8Array>({
    start(c) {
      c.enqueue(head);
    },
    async pull(c) {
      const { done, value } = await reader.read();
      if (done) c.close();
      else c.enqueue(value);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
}
