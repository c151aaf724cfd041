// The bridge's answers. A refusal is {code, message} with a status; the
// agent's own codes keep the agent's statuses (agent/http.go), so that the
// Go agent client reads a bridge refusal exactly as the agent's. Codes the
// bridge adds are also named in the X-Sandboxwich-Bridge-Error header, so
// the driver tells them from anything the container said.

export const BRIDGE_ERROR_HEADER = "X-Sandboxwich-Bridge-Error";

/** Codes of the agent protocol the bridge itself may answer. */
export type AgentCode = "fence_refused" | "not_active" | "expired" | "invalid_request" | "too_large";

/** Codes only the bridge answers. */
export type BridgeCode =
  | "unauthorized"
  | "not_found"
  | "cell_not_found"
  | "cell_lost"
  | "cell_deleted"
  | "pool_mismatch"
  | "identity_mismatch"
  | "container_unavailable"
  | "deletion_unconfirmed"
  | "internal";

const STATUS: Record<AgentCode | BridgeCode, number> = {
  fence_refused: 409,
  not_active: 409,
  expired: 410,
  invalid_request: 422,
  too_large: 413,
  unauthorized: 401,
  not_found: 404,
  cell_not_found: 404,
  cell_lost: 409,
  cell_deleted: 409,
  pool_mismatch: 409,
  identity_mismatch: 409,
  container_unavailable: 503,
  deletion_unconfirmed: 503,
  internal: 500,
};

const AGENT_CODES = new Set<string>(["fence_refused", "not_active", "expired", "invalid_request", "too_large"]);

/** json answers v with status. */
export function json(status: number, v: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(v), {
    status,
    headers: { "Content-Type": "application/json", "Cache-Control": "no-store", ...headers },
  });
}

/** refuse answers a refusal. Messages never carry request content. */
export function refuse(code: AgentCode | BridgeCode, message: string, extra: Record<string, unknown> = {}): Response {
  const headers: Record<string, string> = {};
  if (!AGENT_CODES.has(code)) headers[BRIDGE_ERROR_HEADER] = code;
  if (code === "unauthorized") headers["WWW-Authenticate"] = 'Bearer realm="sandboxwich-bridge"';
  return json(STATUS[code], { code, message, ...extra }, headers);
}
