// The registry: one Durable Object listing every cell the bridge holds, so
// that the driver can find orphans (Durable Objects cannot be enumerated).
// A cell joins it before its object is created and leaves it only after
// its deletion is proven.

import { DurableObject } from "cloudflare:workers";
import type { Env } from "./env.js";
import { json, refuse } from "./errors.js";
import * as v from "./validate.js";

interface Entry {
  pool: string;
  added_at: string;
}

const PREFIX = "cell:";

export class Registry extends DurableObject<Env> {
  override async fetch(req: Request): Promise<Response> {
    const url = new URL(req.url);
    try {
      if (req.method === "POST" && url.pathname === "/add") {
        const b = (await req.json()) as { cell_id: unknown; pool: unknown };
        const id = v.uuid(b.cell_id, "cell_id");
        const pool = v.pool(b.pool);
        const old = await this.ctx.storage.get<Entry>(PREFIX + id);
        if (old === undefined) await this.ctx.storage.put(PREFIX + id, { pool, added_at: new Date().toISOString() });
        return json(200, { ok: true });
      }
      if (req.method === "POST" && url.pathname === "/remove") {
        const b = (await req.json()) as { cell_id: unknown };
        await this.ctx.storage.delete(PREFIX + v.uuid(b.cell_id, "cell_id"));
        return json(200, { ok: true });
      }
      if (req.method === "GET" && url.pathname === "/list") {
        const pool = v.pool(url.searchParams.get("pool"));
        const cells: string[] = [];
        const all = await this.ctx.storage.list<Entry>({ prefix: PREFIX });
        for (const [k, e] of all) if (e.pool === pool) cells.push(k.slice(PREFIX.length));
        return json(200, { cells });
      }
      return refuse("not_found", "no such route");
    } catch (e) {
      if (e instanceof v.Invalid) return refuse("invalid_request", e.message);
      return refuse("internal", "the registry failed");
    }
  }
}
