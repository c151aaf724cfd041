// The container behind a cell's Durable Object, reached through a small
// interface so that tests can put the real cell agent behind the same
// boundary (test/loopback.ts) where no container runtime exists.

/** The port the cell agent listens on inside the container. */
export const AGENT_PORT = 8080;

/** One started container instance. */
export interface Instance {
  /** id names this start of the container; a restart has another. */
  id: string;
}

/** What a cell's Durable Object needs of its container. */
export interface CellContainer {
  /** backend names the implementation for the status route. */
  readonly backend: string;
  /** start starts the container running the agent for cellId. */
  start(cellId: string): Promise<Instance>;
  /** current reports the running instance, or null when none runs. */
  current(): Promise<Instance | null>;
  /** fetch sends one request to the agent's HTTP server in the container. */
  fetch(path: string, init: RequestInit): Promise<Response>;
  /** destroy stops the container; it resolves once the stop is requested. */
  destroy(): Promise<void>;
}

/**
 * CloudflareContainer is a Cloudflare Container bound to the Durable
 * Object (ctx.container). The instance id is a nonce the object records
 * when it starts the container: Cloudflare reports no instance identity, so
 * a container that is not running, or that stopped since (monitor()
 * settled), is no longer that instance — the object never starts a second
 * one for the same cell.
 */
export class CloudflareContainer implements CellContainer {
  readonly backend = "cloudflare-container";
  private stopped = false;

  constructor(
    private readonly state: DurableObjectState,
    private readonly nonce: () => Promise<string | null>,
  ) {}

  private get c(): Container {
    const c = this.state.container;
    if (c === undefined) throw new Error("the Durable Object has no container: check the containers section of the wrangler configuration");
    return c;
  }

  async start(cellId: string): Promise<Instance> {
    const c = this.c;
    if (!c.running) {
      c.start({
        entrypoint: ["/sandboxwich-agent", "-listen", `tcp:0.0.0.0:${AGENT_PORT}`, "-cell-id", cellId],
        enableInternet: false,
      });
    }
    const settle = (): void => {
      this.stopped = true;
    };
    c.monitor().then(settle, settle);
    return { id: crypto.randomUUID() };
  }

  async current(): Promise<Instance | null> {
    const id = await this.nonce();
    if (id === null || this.stopped || !this.c.running) return null;
    return { id };
  }

  fetch(path: string, init: RequestInit): Promise<Response> {
    return this.c.getTcpPort(AGENT_PORT).fetch(`http://container${path}`, init);
  }

  async destroy(): Promise<void> {
    if (this.c.running) await this.c.destroy();
  }
}
