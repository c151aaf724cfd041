// A cell container for tests: the REAL cell agent binary, started by the
// loopback container manager (test/manager.mjs) in its own mount and PID
// namespaces and listening on loopback TCP, reached at the Durable
// Object's boundary exactly where ctx.container would be.

import type { CellContainer, Instance } from "../src/container.js";

interface Running {
  instance: string;
  port: number;
}

export class LoopbackContainer implements CellContainer {
  readonly backend = "loopback-test";
  private port: number | undefined;

  constructor(
    private readonly manager: string,
    private readonly cellId: () => Promise<string | null>,
  ) {}

  private async running(id: string): Promise<Running | null> {
    const r = await fetch(`${this.manager}/containers/${id}`);
    if (r.status === 404) {
      await r.body?.cancel();
      return null;
    }
    if (r.status !== 200) throw new Error(`manager answered ${r.status}`);
    return (await r.json()) as Running;
  }

  async start(cellId: string): Promise<Instance> {
    const r = await fetch(`${this.manager}/containers/${cellId}/start`, { method: "POST" });
    if (r.status !== 200) throw new Error(`manager answered ${r.status}`);
    const run = (await r.json()) as Running;
    this.port = run.port;
    return { id: run.instance };
  }

  async current(): Promise<Instance | null> {
    const id = await this.cellId();
    if (id === null) return null;
    const run = await this.running(id);
    if (run === null) return null;
    this.port = run.port;
    return { id: run.instance };
  }

  async fetch(path: string, init: RequestInit): Promise<Response> {
    if (this.port === undefined) await this.current();
    if (this.port === undefined) throw new Error("no container");
    return fetch(`http://127.0.0.1:${this.port}${path}`, init);
  }

  async destroy(): Promise<void> {
    const id = await this.cellId();
    if (id === null) return;
    const r = await fetch(`${this.manager}/containers/${id}`, { method: "DELETE" });
    await r.body?.cancel();
    if (r.status !== 200) throw new Error(`manager answered ${r.status}`);
  }
}
