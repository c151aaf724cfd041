"""What the sync and async clients share: requests, retries, errors, SSE."""

from __future__ import annotations

import base64
import email.utils
import json
import os
import random
import secrets
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, Any, Literal, Union
from urllib.parse import quote, urlencode, urlsplit

import httpx

from .errors import APIError, ProtocolError, StreamIncompleteError, api_error, code_for_status, status_for_code
from .models import ExecExit, ExecOutput, ExecResponse, ExecResult, Lease, Release, StreamError
from .secret import Attestation

OPERATOR_HEADER = "x-sandboxwich-operator-token"
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_RETRY_AFTER = 60.0
MAX_RESPONSE_BYTES = 8 << 20
STORED_EXEC_OUTPUT_MAX = 1 << 20
"""The most output per stream an exec with an Idempotency-Key may ask for
(the server stores its answer capped at 1 MiB per stream; CONTRACT §25)."""
CHUNK = 1 << 16

__version__ = "0.4.0"
USER_AGENT = "sandboxwich-python/" + __version__

UploadSource = Union[bytes, bytearray, memoryview, "os.PathLike[str]", IO[bytes]]
"""What :meth:`Client.write_file` uploads: bytes, a path (``pathlib.Path``),
or a binary file object read as it is sent."""


def uuid7() -> uuid.UUID:
    """A new UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(secrets.token_bytes(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of claims and reads: at most ``max_attempts`` attempts in all
    (1 disables retries), waiting before retry n (n = 1, 2, …) a uniformly
    random time in [0, min(max_delay, base_delay·2ⁿ⁻¹)] ("full jitter"), or
    the answer's Retry-After (up to one minute) when it has one. The
    defaults are the Go client's."""

    max_attempts: int = 6
    base_delay: float = 0.05
    max_delay: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ValueError("RetryPolicy needs max_attempts >= 1 and 0 <= base_delay <= max_delay")

    def backoff(self, n: int) -> float:
        """The full-jitter wait before retry n (n >= 1)."""
        d = min(self.base_delay * (2 ** (n - 1)), self.max_delay)
        return random.uniform(0, d) if d > 0 else 0.0


def retry_after(value: str | None, now: float | None = None) -> float:
    """Seconds of a Retry-After header (delay seconds or an HTTP date), at
    most one minute; 0 when absent or unreadable."""
    if not value:
        return 0.0
    v = value.strip()
    if v.isdigit():
        return min(float(int(v)), MAX_RETRY_AFTER)
    try:
        t = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError):
        return 0.0
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    d = t.timestamp() - (time.time() if now is None else now)
    if d <= 0:
        return 0.0
    return float(min(int(d + 0.999999), int(MAX_RETRY_AFTER)))


def retryable(err: BaseException) -> bool:
    """Whether a failure of a claim or a read may be tried again: a transport
    error, 5xx (not 501, not auth_not_configured, not insufficient_storage),
    429, or a contended claim."""
    if isinstance(err, httpx.TransportError):
        return True
    if isinstance(err, APIError):
        if err.status == 429:
            return True
        if err.status == 409:
            return err.code == "sterile_cell_claim_contended"
        if err.status >= 500:
            return err.status != 501 and err.code not in ("auth_not_configured", "insufficient_storage")
    return False


def error_from(resp: httpx.Response, data: bytes) -> APIError:
    """The typed exception of a non-2xx answer whose body is data."""
    rid = resp.headers.get("x-request-id")
    code, message = "", ""
    try:
        body = json.loads(data)
        if isinstance(body, dict) and isinstance(body.get("code"), str) and body["code"]:
            code, message = body["code"], str(body.get("message", ""))
    except ValueError:
        pass
    if not code:  # not one of ours (a proxy's page): never quote the body
        code, message = code_for_status(resp.status_code), resp.reason_phrase
    return api_error(resp.status_code, code, message, rid, retry_after(resp.headers.get("retry-after")))


def base_url(url: str) -> str:
    u = urlsplit(url.rstrip("/"))
    if u.scheme not in ("http", "https"):
        raise ValueError(f"base URL {url!r} must start with http:// or https://")
    if not u.hostname:
        raise ValueError(f"base URL {url!r} has no host")
    if u.username or u.password:
        raise ValueError("base URL must not hold credentials; pass token=")
    if u.query or u.fragment:
        raise ValueError(f"base URL {url!r} must not have a query or fragment")
    return url.rstrip("/")


def read_secret_file(path: str | os.PathLike[str]) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def auth_headers(token: str | None, operator_token: str | None) -> dict[str, str]:
    for t in (token, operator_token):
        if t is not None and ("\r" in t or "\n" in t):
            raise ValueError("a token contains a line break")
    h = {"User-Agent": USER_AGENT}
    if token:
        h["Authorization"] = "Bearer " + token
    if operator_token:
        h[OPERATOR_HEADER] = operator_token
    return h


@dataclass(frozen=True)
class Proof:
    """The lease fence that every lease operation presents: the lease ID, the
    attestation, the generation and the binding. Get it from
    :meth:`Claim.proof`."""

    lease_id: uuid.UUID
    attestation: Attestation
    generation: int
    organization_id: str
    workspace_id: str
    thread_id: str
    runner_session_id: str

    def body(self) -> dict[str, Any]:
        return {
            "lease_attestation": self.attestation.reveal(),
            "generation": self.generation,
            "organization_id": self.organization_id,
            "workspace_id": self.workspace_id,
            "thread_id": self.thread_id,
            "runner_session_id": self.runner_session_id,
        }


@dataclass(frozen=True)
class Claim:
    """The outcome of a claim. ``lease`` is None for an empty claim (no ready
    cell matched); ``claim_id`` is the fence that was sent. The attestation
    never shows in ``repr``/``str``. ``empty_reason`` says why a claim that
    carried ``image`` or ``wait_seconds`` > 0 is empty (``"wait_elapsed"``,
    ``"no_inventory"``, …, :data:`~sandboxwich.EmptyReason`); None otherwise."""

    claim_id: uuid.UUID
    lease: Lease | None
    attestation: Attestation | None = field(default=None, repr=False)
    empty_reason: str | None = None

    @property
    def empty(self) -> bool:
        return self.lease is None

    def proof(self) -> Proof:
        if self.lease is None or self.attestation is None:
            raise ValueError("an empty claim has no lease fence")
        lz = self.lease
        return Proof(
            lz.lease_id,
            self.attestation,
            lz.generation,
            lz.organization_id,
            lz.workspace_id,
            lz.thread_id,
            lz.runner_session_id,
        )


@dataclass(frozen=True)
class LeasePage:
    """One page of the tenant's leases, newest first; ``next_cursor`` is None
    on the last page."""

    leases: list[Any]
    next_cursor: str | None


@dataclass(frozen=True)
class Req:
    """One API call."""

    method: str
    path: str  # below /v1
    body: bytes | None = None
    retry: bool = False
    accept: str = "application/json"
    idempotency_key: str | None = None
    timeout: float | None = None
    content_type: str = "application/json"
    max_response: int = MAX_RESPONSE_BYTES


def encode(body: Mapping[str, Any]) -> bytes:
    """The JSON of a request body: encoded once, resent byte for byte."""
    return json.dumps({k: v for k, v in body.items() if v is not None}, separators=(",", ":")).encode()


def lease_path(lease_id: uuid.UUID | str, suffix: str = "") -> str:
    return "/sterile-cell-leases/" + quote(str(uuid.UUID(str(lease_id)))) + suffix


CLAIM_WAIT_MARGIN = 30.0
"""How much longer than its wait_seconds the HTTP read timeout of a waiting
claim is: the server answers when the wait ends, then needs time to write."""


def claim_req(
    release: Release,
    organization_id: str,
    workspace_id: str,
    thread_id: str,
    runner_session_id: str,
    lease_seconds: int | None,
    claim_id: uuid.UUID,
    image: str | None = None,
    wait_seconds: int | None = None,
    default_timeout: float = 60.0,
    egress: Sequence[str] | None = None,
) -> Req:
    """The claim's request: its body encoded once (every retry resends these
    bytes under the same claim_id) and, for a claim that may wait, a read
    timeout that outlasts the wait. The range of wait_seconds (0 to 300) is the
    server's to check: outside it the answer is 422 invalid_request."""
    if wait_seconds is not None and (isinstance(wait_seconds, bool) or not isinstance(wait_seconds, int)):
        raise TypeError("wait_seconds is a whole number of seconds")
    if egress is not None and (isinstance(egress, (str, bytes)) or not all(isinstance(h, str) for h in egress)):
        raise TypeError("egress is a list of host[:port] strings ([] for none)")
    body = {
        "claim_id": str(claim_id),
        "release": release.model_dump(mode="json"),
        "organization_id": organization_id,
        "workspace_id": workspace_id,
        "thread_id": thread_id,
        "runner_session_id": runner_session_id,
        "lease_seconds": lease_seconds,
        "image": image,
        "wait_seconds": wait_seconds,
        "egress": None if egress is None else list(egress),
    }
    timeout = None
    if wait_seconds and wait_seconds > 0:
        timeout = max(default_timeout, wait_seconds + CLAIM_WAIT_MARGIN)
    return Req("POST", "/sterile-cells/claim", encode(body), retry=True, timeout=timeout)


def events_query(after: str, limit: int | None, type: str | None, pool: str | None, lease_id: uuid.UUID | str | None) -> str:
    """The query of GET /v1/events?format=json."""
    q: dict[str, str] = {"format": "json", "after": after}
    if limit is not None:
        q["limit"] = str(limit)
    for k, v in (("type", type), ("pool", pool), ("lease_id", str(lease_id) if lease_id else None)):
        if v:
            q[k] = v
    return "?" + urllib.parse.urlencode(q)


def list_query(
    organization_id: str | None,
    workspace_id: str | None,
    thread_id: str | None,
    runner_session_id: str | None,
    live: bool | None,
    limit: int | None,
    cursor: str | None,
) -> str:
    q: dict[str, str] = {}
    for k, v in (
        ("organization_id", organization_id),
        ("workspace_id", workspace_id),
        ("thread_id", thread_id),
        ("runner_session_id", runner_session_id),
    ):
        if v:
            q[k] = v
    if live is not None:
        q["live"] = "true" if live else "false"
    if limit:
        q["limit"] = str(limit)
    if cursor:
        q["cursor"] = cursor
    return "?" + urlencode(q) if q else ""


def exec_body(
    proof: Proof,
    argv: list[str],
    stdin: bytes | str | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    user: str | None,
    timeout: float | None,
    max_output_bytes: int | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv is a list of strings")
    if max_output_bytes is not None:
        if isinstance(max_output_bytes, bool) or not isinstance(max_output_bytes, int) or max_output_bytes < 1:
            raise ValueError("max_output_bytes is a positive number of bytes")
        if idempotency_key and max_output_bytes > STORED_EXEC_OUTPUT_MAX:
            raise ValueError(
                f"max_output_bytes above {STORED_EXEC_OUTPUT_MAX} bytes cannot be combined with an idempotency_key"
                " (the stored answer keeps at most 1 MiB per stream)"
            )
    body = proof.body()
    body["argv"] = list(argv)
    if stdin:
        raw = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
        body["stdin_base64"] = base64.b64encode(raw).decode()
    if env:
        body["env"] = dict(env)
    if cwd:
        body["cwd"] = cwd
    if user:
        body["user"] = user
    if max_output_bytes is not None:
        body["max_output_bytes"] = max_output_bytes
    if timeout is not None:
        if timeout < 0:
            raise ValueError("negative command timeout")
        if timeout > 0:
            body["timeout_seconds"] = int(-(-timeout // 1))
    return body


def exec_response_cap(max_output_bytes: int | None) -> int:
    """The most bytes a JSON exec answer may take: both streams at their
    cap, base64-encoded, plus the rest of the answer."""
    if max_output_bytes is None:
        return MAX_RESPONSE_BYTES
    return max(MAX_RESPONSE_BYTES, 2 * (4 * -(-max_output_bytes // 3)) + (64 << 10))


def exec_timeout(timeout: float | None, default: float) -> float:
    """The HTTP read timeout of an exec whose command may run ``timeout`` s."""
    return max(default, (timeout or 60) + 30)


def decode_exec(r: ExecResponse) -> ExecResult:
    try:
        stdout = base64.b64decode(r.stdout_base64, validate=True)
        stderr = base64.b64decode(r.stderr_base64, validate=True)
    except ValueError as e:
        raise ProtocolError(f"exec response: bad base64: {e}") from None
    return ExecResult(
        exit_code=r.exit_code,
        stdout=stdout,
        stderr=stderr,
        truncated=r.truncated,
        timed_out=r.timed_out,
        signal=r.signal,
        reason=r.reason,
        duration_ms=r.duration_ms,
        max_output_bytes=r.max_output_bytes,
        message=r.message,
    )


def file_mode(mode: int | None) -> str | None:
    if mode is None:
        return None
    if mode & ~0o777:
        raise ValueError(f"file mode {oct(mode)} has bits other than permissions")
    return f"{mode:04o}"


# Streamed exec.


@dataclass(frozen=True)
class OutputEvent:
    """A chunk of a streamed command's output, in the order produced."""

    stream: Literal["stdout", "stderr"]
    data: bytes = field(repr=False)


@dataclass(frozen=True)
class ExitEvent:
    """The last event of a streamed command: how it ended."""

    exit: ExecExit


StreamEvent = Union[OutputEvent, ExitEvent]


class SSEDecoder:
    """Decodes the events of a streamed exec, one line at a time."""

    def __init__(self, request_id: str | None) -> None:
        self.request_id = request_id
        self.event = ""
        self.data: list[str] = []
        self.done = False

    def feed(self, line: str) -> StreamEvent | None:
        line = line.rstrip("\r\n")
        if line:
            if line.startswith(":"):
                return None
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                self.event = value
            elif name == "data":
                self.data.append(value)
            return None
        name, data = self.event, self.data
        self.event, self.data = "", []
        if not data:
            return None
        payload = "\n".join(data)
        try:
            if name in ("stdout", "stderr"):
                o = ExecOutput.model_validate_json(payload)
                return OutputEvent(name, base64.b64decode(o.data_base64, validate=True))  # type: ignore[arg-type]
            if name == "exit":
                self.done = True
                return ExitEvent(ExecExit.model_validate_json(payload))
            if name == "error":
                e = StreamError.model_validate_json(payload)
                self.done = True
                raise api_error(status_for_code(e.code), e.code, e.message, self.request_id)
        except APIError:
            raise
        except ValueError as e:
            raise ProtocolError(f"exec stream: bad {name} event: {e}") from None
        return None

    def end(self) -> None:
        if not self.done:
            raise StreamIncompleteError("exec stream ended without an exit event; the command's outcome is unknown")


# Multipart upload of files/write.


def multipart_parts(proof_json: bytes) -> tuple[str, bytes, bytes]:
    """The content type, the head (through the content part's headers) and
    the tail of a files/write body."""
    boundary = "sbw" + secrets.token_hex(16)
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="proof"\r\nContent-Type: application/json\r\n\r\n').encode() + proof_json
    head += (
        f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="content"; filename="content"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    return "multipart/form-data; boundary=" + boundary, head, tail


def iter_source(source: UploadSource) -> Iterator[bytes]:
    """The content of an upload, in chunks, read as it is sent."""
    if isinstance(source, str):
        raise TypeError("write_file takes bytes, a pathlib.Path or a binary file object; wrap a path in pathlib.Path")
    if isinstance(source, (bytes, bytearray, memoryview)):
        mv = memoryview(source)
        for i in range(0, len(mv), CHUNK):
            yield bytes(mv[i : i + CHUNK])
        return
    if isinstance(source, os.PathLike):
        with open(source, "rb") as f:
            yield from _read_chunks(f)
        return
    if hasattr(source, "read"):
        yield from _read_chunks(source)
        return
    raise TypeError(f"cannot upload a {type(source).__name__}")


def _read_chunks(f: IO[bytes]) -> Iterator[bytes]:
    while True:
        b = f.read(CHUNK)
        if not b:
            return
        if not isinstance(b, (bytes, bytearray)):
            raise TypeError("the file object must be opened in binary mode")
        yield bytes(b)


def now_utc() -> datetime:
    return datetime.now(timezone.utc)
