// Strict validation of everything the bridge is sent. Each validator takes
// parsed JSON and returns a fresh object holding only the fields the agent
// protocol defines (so nothing else — an attestation, a binding tuple, a
// token — can ever travel on to the container), or throws an Invalid.

/** A refusal of bad input: invalid_request (422); nothing was changed. */
export class Invalid extends Error {
  constructor(message: string) {
    super(message);
    this.name = "Invalid";
  }
}

/** Bounds of the agent protocol (agent/protocol.go). */
export const MAX_PATH = 4096;
export const MAX_STDIN = 1 << 20;
export const MAX_FILE_BYTES = 256 << 20;
export const MAX_OUTPUT = 64 << 20;
export const MAX_ARGV = 4096;
export const MAX_JSON_BODY = (2 << 20) + (64 << 10);
/** argv and env are bounded as a whole by the JSON body they arrive in. */
export const MAX_ARG_BYTES = MAX_JSON_BODY;
export const MAX_ENV = 1024;

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const POOL_RE = /^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$/;
const RFC3339_RE = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/;
const ENV_KEY_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
const BASE64_RE = /^[A-Za-z0-9+/]*={0,2}$/;

export type User = "cell" | "root";

export interface Fence {
  cell_id: string;
  lease_id: string;
  generation: number;
}

export interface Activation extends Fence {
  version: 1;
  expires_at: string;
  ttl_ms: number;
}

type Obj = Record<string, unknown>;

function object(v: unknown, what: string): Obj {
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    throw new Invalid(`${what} must be a JSON object`);
  }
  return v as Obj;
}

function onlyKeys(o: Obj, allowed: readonly string[], what: string): void {
  for (const k of Object.keys(o)) {
    if (!allowed.includes(k)) {
      throw new Invalid(`${what}: unknown field ${JSON.stringify(k.slice(0, 64))}`);
    }
  }
}

function str(o: Obj, key: string, what: string, max: number, required: boolean): string | undefined {
  const v = o[key];
  if (v === undefined || v === null) {
    if (required) throw new Invalid(`${what}: ${key} is required`);
    return undefined;
  }
  if (typeof v !== "string") throw new Invalid(`${what}: ${key} must be a string`);
  if (v.length > max) throw new Invalid(`${what}: ${key} is longer than ${max}`);
  return v;
}

function int(o: Obj, key: string, what: string, min: number, max: number, required: boolean): number | undefined {
  const v = o[key];
  if (v === undefined || v === null) {
    if (required) throw new Invalid(`${what}: ${key} is required`);
    return undefined;
  }
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min || v > max) {
    throw new Invalid(`${what}: ${key} must be an integer from ${min} to ${max}`);
  }
  return v;
}

/** uuid checks a lower-case canonical UUID. */
export function uuid(v: unknown, what: string): string {
  if (typeof v !== "string" || !UUID_RE.test(v)) throw new Invalid(`${what} must be a lower-case UUID`);
  return v;
}

/** pool checks a pool label. */
export function pool(v: unknown): string {
  if (typeof v !== "string" || !POOL_RE.test(v)) {
    throw new Invalid("pool must be 1 to 200 characters of letters, digits and ._:/-");
  }
  return v;
}

const FENCE_KEYS = ["cell_id", "lease_id", "generation"] as const;

function fenceOf(o: Obj, what: string): Fence {
  return {
    cell_id: uuid(o["cell_id"], `${what}: cell_id`),
    lease_id: uuid(o["lease_id"], `${what}: lease_id`),
    generation: int(o, "generation", what, 1, Number.MAX_SAFE_INTEGER, true)!,
  };
}

/** fence validates a Fence body. */
export function fence(v: unknown): Fence {
  const o = object(v, "fence");
  onlyKeys(o, FENCE_KEYS, "fence");
  return fenceOf(o, "fence");
}

const ACTIVATION_KEYS = ["version", ...FENCE_KEYS, "expires_at", "ttl_ms"] as const;

/** activation validates the sanitized activation of CONTRACT §13, and nothing else. */
export function activation(v: unknown): Activation {
  const o = object(v, "activation");
  onlyKeys(o, ACTIVATION_KEYS, "activation");
  if (o["version"] !== 1) throw new Invalid("activation: version must be 1");
  const expires = str(o, "expires_at", "activation", 64, true)!;
  if (!RFC3339_RE.test(expires) || Number.isNaN(Date.parse(expires))) {
    throw new Invalid("activation: expires_at must be an RFC 3339 time");
  }
  return {
    version: 1,
    ...fenceOf(o, "activation"),
    expires_at: expires,
    ttl_ms: int(o, "ttl_ms", "activation", 1, Number.MAX_SAFE_INTEGER, true)!,
  };
}

/** sameFence reports whether a and b name the same lease of the same cell. */
export function sameFence(a: Fence, b: Fence): boolean {
  return a.cell_id === b.cell_id && a.lease_id === b.lease_id && a.generation === b.generation;
}

/** sameActivation reports an exact replay (ttl_ms is then ignored, as the agent does). */
export function sameActivation(a: Activation, b: Activation): boolean {
  return sameFence(a, b) && Date.parse(a.expires_at) === Date.parse(b.expires_at);
}

function user(o: Obj, what: string): User | undefined {
  const v = o["user"];
  if (v === undefined || v === null || v === "") return undefined;
  if (v !== "cell" && v !== "root") throw new Invalid(`${what}: user must be "cell" or "root"`);
  return v;
}

function absPath(o: Obj, key: string, what: string, required: boolean): string | undefined {
  const p = str(o, key, what, MAX_PATH, required);
  if (p === undefined || p === "") {
    if (required) throw new Invalid(`${what}: ${key} is required`);
    return undefined;
  }
  if (!p.startsWith("/") || p.includes("\0")) throw new Invalid(`${what}: ${key} must be an absolute path`);
  return p;
}

function argv(o: Obj, what: string): string[] {
  const v = o["argv"];
  if (!Array.isArray(v) || v.length === 0 || v.length > MAX_ARGV) {
    throw new Invalid(`${what}: argv must be 1 to ${MAX_ARGV} strings`);
  }
  let total = 0;
  return v.map((a, i) => {
    if (typeof a !== "string" || a.includes("\0")) throw new Invalid(`${what}: argv must hold strings without NUL`);
    if (i === 0 && a === "") throw new Invalid(`${what}: argv[0] must not be empty`);
    total += a.length;
    if (total > MAX_ARG_BYTES) throw new Invalid(`${what}: argv is longer than ${MAX_ARG_BYTES}`);
    return a;
  });
}

function env(o: Obj, what: string): Record<string, string> | undefined {
  const v = o["env"];
  if (v === undefined || v === null) return undefined;
  const e = object(v, `${what}: env`);
  const keys = Object.keys(e);
  if (keys.length > MAX_ENV) throw new Invalid(`${what}: env has more than ${MAX_ENV} entries`);
  const out: Record<string, string> = {};
  for (const k of keys) {
    const val = e[k];
    if (!ENV_KEY_RE.test(k) || k.length > 256) throw new Invalid(`${what}: env name ${JSON.stringify(k.slice(0, 64))} is not valid`);
    if (typeof val !== "string" || val.includes("\0") || val.length > MAX_ARG_BYTES) {
      throw new Invalid(`${what}: env ${k} must be a string without NUL`);
    }
    out[k] = val;
  }
  return out;
}

/** A lease request with the fence it carries and its optional activation. */
export interface LeaseRequest<T> {
  fence: Fence;
  activation?: Activation;
  body: T;
}

function leaseParts(o: Obj, what: string): { fence: Fence; activation?: Activation } {
  const f = fenceOf(o, what);
  const a = o["activation"] === undefined || o["activation"] === null ? undefined : activation(o["activation"]);
  if (a !== undefined && !sameFence(a, f)) throw new Invalid(`${what}: the activation's fence is not the request's`);
  return a === undefined ? { fence: f } : { fence: f, activation: a };
}

function withActivation<T extends object>(f: Fence, a: Activation | undefined, rest: T): Record<string, unknown> {
  const out: Record<string, unknown> = { ...f };
  if (a !== undefined) out["activation"] = a;
  for (const [k, v] of Object.entries(rest)) if (v !== undefined) out[k] = v;
  return out;
}

const EXEC_KEYS = [...FENCE_KEYS, "activation", "argv", "env", "cwd", "user", "stdin", "timeout_ms", "max_output"] as const;

/** execRequest validates an agent ExecRequest. */
export function execRequest(v: unknown): LeaseRequest<Record<string, unknown>> {
  const o = object(v, "exec");
  onlyKeys(o, EXEC_KEYS, "exec");
  const { fence: f, activation: a } = leaseParts(o, "exec");
  const stdin = str(o, "stdin", "exec", Math.ceil(MAX_STDIN / 3) * 4, false);
  if (stdin !== undefined && !BASE64_RE.test(stdin)) throw new Invalid("exec: stdin must be base64");
  const body = withActivation(f, a, {
    argv: argv(o, "exec"),
    env: env(o, "exec"),
    cwd: absPath(o, "cwd", "exec", false),
    user: user(o, "exec"),
    stdin,
    timeout_ms: int(o, "timeout_ms", "exec", 0, Number.MAX_SAFE_INTEGER, false),
    max_output: int(o, "max_output", "exec", 0, MAX_OUTPUT, false),
  });
  return a === undefined ? { fence: f, body } : { fence: f, activation: a, body };
}

const LAUNCH_KEYS = [...FENCE_KEYS, "activation", "argv", "env", "cwd", "user"] as const;

/** launchRequest validates an agent LaunchRequest. */
export function launchRequest(v: unknown): LeaseRequest<Record<string, unknown>> {
  const o = object(v, "launch");
  onlyKeys(o, LAUNCH_KEYS, "launch");
  const { fence: f, activation: a } = leaseParts(o, "launch");
  const body = withActivation(f, a, {
    argv: argv(o, "launch"),
    env: env(o, "launch"),
    cwd: absPath(o, "cwd", "launch", false),
    user: user(o, "launch"),
  });
  return a === undefined ? { fence: f, body } : { fence: f, activation: a, body };
}

const WRITE_KEYS = [...FENCE_KEYS, "activation", "path", "mode", "user"] as const;

/** writeRequest validates the header line of an agent file write. */
export function writeRequest(v: unknown): LeaseRequest<Record<string, unknown>> {
  const o = object(v, "files/write");
  onlyKeys(o, WRITE_KEYS, "files/write");
  const { fence: f, activation: a } = leaseParts(o, "files/write");
  const body = withActivation(f, a, {
    path: absPath(o, "path", "files/write", true),
    mode: int(o, "mode", "files/write", 0, 0o7777, false),
    user: user(o, "files/write"),
  });
  return a === undefined ? { fence: f, body } : { fence: f, activation: a, body };
}

const READ_KEYS = [...FENCE_KEYS, "activation", "path", "max_bytes", "user"] as const;

/** readRequest validates an agent ReadRequest. */
export function readRequest(v: unknown): LeaseRequest<Record<string, unknown>> {
  const o = object(v, "files/read");
  onlyKeys(o, READ_KEYS, "files/read");
  const { fence: f, activation: a } = leaseParts(o, "files/read");
  const body = withActivation(f, a, {
    path: absPath(o, "path", "files/read", true),
    max_bytes: int(o, "max_bytes", "files/read", 0, MAX_FILE_BYTES, false),
    user: user(o, "files/read"),
  });
  return a === undefined ? { fence: f, body } : { fence: f, activation: a, body };
}

/** createRequest validates POST /v1/cells. */
export function createRequest(v: unknown): { cell_id: string; pool: string } {
  const o = object(v, "create");
  onlyKeys(o, ["cell_id", "pool"], "create");
  return { cell_id: uuid(o["cell_id"], "create: cell_id"), pool: pool(o["pool"]) };
}
