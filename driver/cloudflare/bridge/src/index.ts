// The Sandboxwich bridge Worker (CONTRACT §18): the driver's one way into
// Cloudflare at run time. Every route takes the bearer token; each cell is
// one Durable Object (CellObject) with one container running the cell
// agent. Routes:
//
//   GET    /v1/bridge                      the bridge's identity and configuration
//   POST   /v1/cells {cell_id, pool}       create (idempotent by cell ID), start the container
//   GET    /v1/cells?pool=P                every cell of pool P (orphan listing)
//   GET    /v1/cells/:id                   the cell's status (identity, state, image, instance type, readiness)
//   DELETE /v1/cells/:id                   destroy, with a read-back of absence (X-Sandboxwich-Identity: the identity)
//   *      /v1/cells/:id/agent/v1/...      the agent protocol (agent/http.go), validated and forwarded
//                                          (X-Sandboxwich-Identity required; an exec may name itself
//                                          with X-Sandboxwich-Request: <uuid>)
//   POST   /v1/cells/:id/agent-cancel      {request_id}: abort that exec (its command is killed)

import { CellObject, IDENTITY_HEADER, REQUEST_HEADER } from "./cell.js";
import type { Env } from "./env.js";
import { json, refuse } from "./errors.js";
import { Registry } from "./registry.js";
import * as v from "./validate.js";
import { BRIDGE_VERSION } from "./version.js";

export { CellObject, Registry };

const REGISTRY_NAME = "registry";

/** authorized compares the bearer token with the secret in constant time (over SHA-256 digests). */
export async function authorized(req: Request, env: Env): Promise<boolean> {
  const secret = env.BRIDGE_TOKEN;
  if (typeof secret !== "string" || secret.length < 32) return false; // a deployment without a real token serves nothing
  const h = req.headers.get("Authorization") ?? "";
  const m = /^Bearer ([\x21-\x7e]{1,1024})$/.exec(h);
  const given = m?.[1] ?? "";
  const enc = new TextEncoder();
  const [a, b] = await Promise.all([
    crypto.subtle.digest("SHA-256", enc.encode(given)),
    crypto.subtle.digest("SHA-256", enc.encode(secret)),
  ]);
  return crypto.subtle.timingSafeEqual(a, b) && m !== null;
}

function registry(env: Env): DurableObjectStub {
  return env.REGISTRY.get(env.REGISTRY.idFromName(REGISTRY_NAME));
}

function cell(env: Env, id: string): DurableObjectStub {
  return env.CELLS.get(env.CELLS.idFromName(id));
}

async function ok(r: Response): Promise<void> {
  if (r.status !== 200) throw new Error(`registry answered ${r.status}`);
  await r.body?.cancel();
}

async function handle(req: Request, env: Env): Promise<Response> {
  const url = new URL(req.url);
  const parts = url.pathname.split("/");
  if (parts[1] !== "v1") return refuse("not_found", "no such route");
  if (!(await authorized(req, env))) return refuse("unauthorized", "a valid bearer token is required");

  if (url.pathname === "/v1/bridge" && req.method === "GET") {
    return json(200, {
      bridge_version: BRIDGE_VERSION,
      container_class: env.CONTAINER_CLASS,
      image: env.CELL_IMAGE,
      instance_type: env.CELL_INSTANCE_TYPE,
    });
  }
  if (url.pathname === "/v1/cells") {
    if (req.method === "GET") {
      const pool = v.pool(url.searchParams.get("pool"));
      return registry(env).fetch(`https://registry/list?pool=${encodeURIComponent(pool)}`);
    }
    if (req.method === "POST") {
      const text = await req.text();
      if (text.length > 4096) throw new v.Invalid("the request body is too large");
      let parsed: unknown;
      try {
        parsed = JSON.parse(text);
      } catch {
        throw new v.Invalid("the request body is not JSON");
      }
      const body = v.createRequest(parsed);
      // Listed first: an object is never made that the listing cannot find.
      await ok(await registry(env).fetch("https://registry/add", { method: "POST", body: JSON.stringify(body) }));
      const r = await cell(env, body.cell_id).fetch("https://cell/create", { method: "POST", body: JSON.stringify(body) });
      if (r.status === 409 && r.headers.get("X-Sandboxwich-Bridge-Error") === "cell_deleted") {
        const rr = await registry(env).fetch("https://registry/remove", { method: "POST", body: JSON.stringify({ cell_id: body.cell_id }) });
        await rr.body?.cancel();
      }
      return r;
    }
    return refuse("not_found", "no such route");
  }
  if (parts[2] === "cells" && parts.length >= 4) {
    const id = v.uuid(parts[3], "the cell ID in the path");
    const stub = cell(env, id);
    if (parts.length === 4) {
      if (req.method === "GET") return stub.fetch("https://cell/status");
      if (req.method === "DELETE") {
        const identity = req.headers.get(IDENTITY_HEADER) ?? "";
        const r = await stub.fetch("https://cell/delete", { method: "POST", headers: { [IDENTITY_HEADER]: identity } });
        if (r.status === 200) {
          // Unlisted only once absence is proven.
          await ok(await registry(env).fetch("https://registry/remove", { method: "POST", body: JSON.stringify({ cell_id: id }) }));
        }
        return r;
      }
      return refuse("not_found", "no such route");
    }
    if (parts[4] === "agent-cancel" && parts.length === 5 && req.method === "POST") {
      return stub.fetch("https://cell/cancel", { method: "POST", body: await req.text() });
    }
    if (parts[4] === "agent") {
      const rest = "/" + parts.slice(5).join("/");
      const headers = new Headers();
      headers.set(IDENTITY_HEADER, req.headers.get(IDENTITY_HEADER) ?? "");
      const rid = req.headers.get(REQUEST_HEADER);
      if (rid !== null) headers.set(REQUEST_HEADER, rid);
      const len = req.headers.get("Content-Length");
      if (len !== null) headers.set("Content-Length", len);
      const init: RequestInit = { method: req.method, headers, signal: req.signal };
      if (req.method !== "GET" && req.method !== "HEAD") init.body = req.body;
      return stub.fetch(`https://cell/agent${rest}${url.search}`, init);
    }
  }
  return refuse("not_found", "no such route");
}

export default {
  async fetch(req: Request, env: Env): Promise<Response> {
    try {
      return await handle(req, env);
    } catch (e) {
      if (e instanceof v.Invalid) return refuse("invalid_request", e.message);
      return refuse("internal", "the bridge failed");
    }
  },
} satisfies ExportedHandler<Env>;
