/** The bindings the bridge Worker is deployed with (wrangler.jsonc). */
export interface Env {
  /** CELLS is the Durable Object namespace of the cells (class CellObject). */
  CELLS: DurableObjectNamespace;
  /** REGISTRY is the namespace of the one registry object (class Registry). */
  REGISTRY: DurableObjectNamespace;
  /** BRIDGE_TOKEN is the bearer token (a secret: `wrangler secret put BRIDGE_TOKEN`). */
  BRIDGE_TOKEN: string;
  /** CELL_IMAGE is the image reference of the container class, pinned by digest. */
  CELL_IMAGE: string;
  /** CELL_INSTANCE_TYPE is the container class's instance type. */
  CELL_INSTANCE_TYPE: string;
  /** CONTAINER_CLASS names the container class (the Durable Object class). */
  CONTAINER_CLASS: string;
}
