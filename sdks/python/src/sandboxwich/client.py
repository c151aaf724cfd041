"""The synchronous client."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import IO, Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from . import _core
from ._core import Claim, LeasePage, Proof, Req, RetryPolicy, StreamEvent, UploadSource
from ._keepalive import KeepAlive
from .errors import APIError, ProtocolError, SandboxwichError, TransportError
from .models import (
    ClaimResponse,
    Disposition,
    EgressHost,
    EgressResponse,
    Event,
    EventsResponse,
    Evidence,
    EvidenceResponse,
    ExecResponse,
    ExecResult,
    FileWriteResponse,
    Health,
    InventoryEntry,
    InventoryResponse,
    Launch,
    LaunchResponse,
    Lease,
    LeasesResponse,
    LeaseStatus,
    LeaseSummary,
    Pool,
    PoolsResponse,
    Release,
    RenewResponse,
    StatusResponse,
    User,
    ValidateResponse,
)

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class Client:
    """A client of one Sandboxwich server (CONTRACT §5, §6, §14, §15).

    ``Client("http://127.0.0.1:3217", token=...)``, or ``token_file=`` to
    read the tenant token from a file. Pass ``operator_token`` (or
    ``operator_token_file``) for :meth:`pools`. It is safe to share between
    threads; close it (or use it as a context manager) when done.

    Retries (exactly the Go client's rules): :meth:`claim` always sends a
    ``claim_id`` (a new UUIDv7 when none is given), encodes its body once and
    resends it byte for byte, with the same claim ID, on transport errors,
    5xx (not 501, auth_not_configured or insufficient_storage), 429 and 409
    sterile_cell_claim_contended, with full-jitter backoff honouring
    Retry-After, until an answer arrives or the attempts run out. The server
    fences every claim on (tenant, claim_id), so a retry after a lost
    response gets the same lease and a byte-identical attestation: never a
    second cell. Reads (:meth:`lease`, :meth:`list_leases`,
    :meth:`inventory`, :meth:`evidence`, :meth:`launch_status`,
    :meth:`pools`), :meth:`validate` and :meth:`read_file` (until the
    content starts) retry the same way, since repeating them changes
    nothing; so does :meth:`launch`, which the server answers once per
    lease, and :meth:`renew`, each of which sets the expiry from its own
    now (never twice the extension). :meth:`release`, :meth:`revoke`, :meth:`exec`,
    :meth:`exec_stream` and :meth:`write_file` are sent exactly once: after
    a lost response their outcome is unknown and a blind repeat is not
    harmless (a command would run twice, an upload's file object is
    consumed, a release repeated after the stop completed fails the fence
    although the first succeeded). Resolve that with a read
    (:meth:`lease`), or give :meth:`exec` an ``idempotency_key``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        operator_token: str | None = None,
        operator_token_file: str | os.PathLike[str] | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if token_file is not None:
            token = _core.read_secret_file(token_file)
        if operator_token_file is not None:
            operator_token = _core.read_secret_file(operator_token_file)
        self._base = _core.base_url(base_url)
        self._retry = retry or RetryPolicy()
        self._timeout = timeout
        self._sleep = sleep
        self._http = httpx.Client(
            headers=_core.auth_headers(token, operator_token),
            timeout=httpx.Timeout(timeout, connect=10.0),
            transport=transport,
            follow_redirects=False,
        )
        self._keepalives: dict[uuid.UUID, list[KeepAlive]] = {}
        self._keepalives_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"sandboxwich.Client({self._base!r})"

    def close(self) -> None:
        """Close the connections; every keep-alive of this client stops."""
        self._halt_keep_alives(None)
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # Transport.

    def _open(self, r: Req, content: Any = None) -> httpx.Response:
        """Send one attempt and return its 2xx response, body unread."""
        headers = {"Accept": r.accept}
        body = content if content is not None else r.body
        if body is not None:
            headers["Content-Type"] = r.content_type
        if r.idempotency_key:
            headers[_core.IDEMPOTENCY_HEADER] = r.idempotency_key
        timeout = httpx.Timeout(r.timeout or self._timeout, connect=10.0)
        req = self._http.build_request(r.method, self._base + "/v1" + r.path, content=body, headers=headers, timeout=timeout)
        resp = self._http.send(req, stream=True)
        if 200 <= resp.status_code <= 299:
            return resp
        try:
            data = _read_capped(resp)
        finally:
            resp.close()
        raise _core.error_from(resp, data)

    def _retrying(self, r: Req, attempt: Callable[[], T], claim_id: uuid.UUID | None = None) -> T:
        attempts = self._retry.max_attempts if r.retry else 1
        n = 1
        while True:
            try:
                return attempt()
            except (httpx.TransportError, APIError) as e:
                if not _core.retryable(e) or n >= attempts:
                    raise _final(e, n, claim_id) from e
                wait = e.retry_after if isinstance(e, APIError) and e.retry_after > 0 else self._retry.backoff(n)
                self._sleep(wait)
                n += 1

    def _json(self, r: Req, model: type[M], claim_id: uuid.UUID | None = None) -> M:
        def attempt() -> M:
            resp = self._open(r)
            try:
                data = _read_capped(resp, r.max_response)
            finally:
                resp.close()
            try:
                return model.model_validate_json(data)
            except ValidationError as e:
                raise ProtocolError(f"{r.method} {r.path.split('?')[0]}: decoding the {resp.status_code} response: {e.error_count()} errors") from None

        return self._retrying(r, attempt, claim_id)

    # Operational.

    def health(self) -> Health:
        """``GET /readyz``: the server is up, its database reachable and
        authentication configured (a 503 raises)."""
        r = Req("GET", "/readyz", retry=True)
        return self._json(r, Health)

    # Tenant routes.

    def claim(
        self,
        release: Release,
        *,
        organization_id: str,
        workspace_id: str,
        thread_id: str,
        runner_session_id: str,
        lease_seconds: int | None = None,
        claim_id: uuid.UUID | None = None,
        image: str | None = None,
        wait_seconds: int | None = None,
        egress: Sequence[str] | None = None,
    ) -> Claim:
        """Lease one ready cell of ``release`` bound to the binding
        (``POST /v1/sterile-cells/claim``), fenced by ``claim_id`` (a new
        UUIDv7 when None). An empty claim is not an error: ``lease`` is None.
        An exception raised by claim carries the ``claim_id`` attribute, so
        the caller can retry later under the same fence and still get at most
        one lease.

        ``image`` (an OCI reference pinned by digest, ``host/repo@sha256:…``)
        asks for a cell of that image: a pool of the release must run it, or
        an image class allow its repository; otherwise, and for a tag
        without a digest, ``ImageNotAllowedError`` (422) and nothing is
        recorded (CONTRACT §21). ``wait_seconds`` (0 to 300; outside it the
        server answers ``InvalidRequestError``) lets the claim wait that long
        for a cell when none is ready: it answers once a cell is leased to
        it, or empty with ``empty_reason == "wait_elapsed"``. The HTTP read
        timeout of such a claim is the wait plus 30 s (at least the client's
        ``timeout``); other requests keep theirs. A retry (after a lost
        answer) resends the same bytes under the same ``claim_id`` and joins
        the wait; it never provisions or leases a second cell. An empty
        answer is final for its ``claim_id``: claim again with a new one.

        ``egress`` (``host[:port]`` entries, ``*.suffix`` allowed; ``[]`` for
        none) narrows the egress policy of the pool that serves the claim
        (CONTRACT §22): only a pool whose list covers it serves the claim,
        else ``EgressNotAllowedError`` (422) and nothing is recorded; a
        malformed entry is ``InvalidRequestError``. None keeps the pool's.
        The lease's policy is in its evidence (``egress``,
        ``egress_digest``)."""
        cid = claim_id or _core.uuid7()
        r = _core.claim_req(
            release, organization_id, workspace_id, thread_id, runner_session_id, lease_seconds, cid, image, wait_seconds, self._timeout, egress
        )
        resp = self._json(r, ClaimResponse, cid)
        return _claim(cid, resp)

    def validate(self, proof: Proof) -> Lease:
        """Check the lease fence against the live lease (retried like a read)."""
        r = Req("POST", _core.lease_path(proof.lease_id, "/validate"), _core.encode(proof.body()), retry=True)
        return self._json(r, ValidateResponse).lease

    def renew(self, proof: Proof, lease_seconds: int) -> Lease:
        """Extend the lease (``POST /v1/sterile-cell-leases/{id}/renew``,
        CONTRACT §20) and return it with its new ``expires_at``: at most
        ``lease_seconds`` from now (clamped by the server into [1, its
        maximum lease length], as a claim's), never earlier than before, and
        never past the cell's lifetime cap (the pool's ``max_cell_seconds``
        from the claim), so the answer may show less than asked for. The
        attestation does not change. Retried like a read: each renewal sets
        the expiry from its own now, so a repeat never extends twice. A wrong
        fence, or a lease that is no longer live (expired, released or
        revoked), raises ``ConflictError``; an unknown or foreign lease
        ``NotFoundError``; a ``lease_seconds`` the server refuses
        ``InvalidRequestError``. :meth:`keep_alive` renews for you."""
        if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int):
            raise TypeError("lease_seconds is a whole number of seconds")
        body = proof.body() | {"lease_seconds": lease_seconds}
        r = Req("POST", _core.lease_path(proof.lease_id, "/renew"), _core.encode(body), retry=True)
        return self._json(r, RenewResponse).lease

    def keep_alive(self, proof: Proof, lease_seconds: int, *, expires_at: datetime | None = None) -> KeepAlive:
        """Keep the lease alive from a background thread: renew it (with
        ``lease_seconds``, see :meth:`renew`) at about a third of its
        remaining life, by the last answer's ``expires_at``, until stopped.
        The first renewal is at once, or, given the lease's current
        ``expires_at`` (``claim.lease.expires_at``), at a third of its
        remaining life.

        ``with client.keep_alive(proof, 300) as ka: ...`` stops it on leaving
        the block and then raises its failure, a
        :class:`~sandboxwich.LeaseRenewalError`, if the block itself did not
        raise; ``ka.error`` holds that failure as soon as it happens (check
        it between steps of long work, or call ``ka.check()``). Transient
        failures (transport errors, 5xx, 429) are retried until the lease
        would expire; a refusal (409 ``ConflictError``: the lease is no
        longer live; 404; 422) ends it at once. When the lease reaches the
        cell's lifetime cap its expiry stops moving; the keep-alive then
        renews no faster than before and reports the lease expired once the
        cap passes. :meth:`release` or :meth:`revoke` of the lease and
        :meth:`close` stop it without an error. Clocks are assumed roughly
        in step (the expiry is the server's time)."""
        ka = KeepAlive(self.renew, proof, lease_seconds, expires_at, self._forget_keep_alive)
        with self._keepalives_lock:
            self._keepalives.setdefault(proof.lease_id, []).append(ka)
        ka._start()
        return ka

    def _forget_keep_alive(self, ka: KeepAlive) -> None:
        with self._keepalives_lock:
            kas = self._keepalives.get(ka.lease_id, [])
            if ka in kas:
                kas.remove(ka)
            if not kas:
                self._keepalives.pop(ka.lease_id, None)

    def _halt_keep_alives(self, lease_id: uuid.UUID | None) -> None:
        """Stop the keep-alives of a lease (of every lease when None)."""
        with self._keepalives_lock:
            kas = [k for lid, ks in self._keepalives.items() if lease_id is None or lid == lease_id for k in ks]
        for k in kas:
            k.halt()

    def release(self, proof: Proof, disposition: Disposition = "destroyed") -> LeaseStatus:
        """Record the stop of a pool cell; the status after the intent was
        recorded. Sent once, never retried (see the class documentation);
        :meth:`wait_provider_absent` waits for the proof of deletion. The
        lease's keep-alives stop first."""
        self._halt_keep_alives(proof.lease_id)
        body = proof.body() | {"disposition": disposition}
        r = Req("POST", _core.lease_path(proof.lease_id, "/release"), _core.encode(body))
        return self._json(r, StatusResponse).status

    def lease(self, lease_id: uuid.UUID | str) -> LeaseStatus:
        """The status of a lease (``GET /v1/sterile-cell-leases/{id}``)."""
        return self._json(Req("GET", _core.lease_path(lease_id), retry=True), StatusResponse).status

    def wait_provider_absent(self, lease_id: uuid.UUID | str, *, poll: float = 0.5, timeout: float | None = None) -> LeaseStatus:
        """Poll the lease status until the provider proved its cell gone
        (``provider_absent``) and return it. Transient failures keep it
        polling; ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                st = self.lease(lease_id)
                if st.provider_absent:
                    return st
            except TransportError:
                pass
            except APIError as e:
                if not _core.retryable(e):
                    raise
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"lease {lease_id}: provider_absent not proven within {timeout} s")
            self._sleep(poll)

    def list_leases(
        self,
        *,
        organization_id: str | None = None,
        workspace_id: str | None = None,
        thread_id: str | None = None,
        runner_session_id: str | None = None,
        live: bool | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> LeasePage:
        """One page of the tenant's leases, newest first."""
        q = _core.list_query(organization_id, workspace_id, thread_id, runner_session_id, live, limit, cursor)
        resp = self._json(Req("GET", "/sterile-cell-leases" + q, retry=True), LeasesResponse)
        return LeasePage(list(resp.leases), resp.next_cursor)

    def iter_leases(self, **filters: Any) -> Iterator[LeaseSummary]:
        """Every lease matching the filters of :meth:`list_leases`, page by page."""
        cursor = None
        while True:
            page = self.list_leases(cursor=cursor, **filters)
            yield from page.leases
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def revoke(self, lease_id: uuid.UUID | str, disposition: Disposition | None = None) -> LeaseStatus:
        """End a live lease of the tenant without its attestation (for a
        harness that lost it). Sent once, never retried. The lease's
        keep-alives stop first."""
        self._halt_keep_alives(uuid.UUID(str(lease_id)))
        r = Req("POST", _core.lease_path(lease_id, "/revoke"), _core.encode({"disposition": disposition}))
        return self._json(r, StatusResponse).status

    def inventory(self) -> list[InventoryEntry]:
        """Ready cells per release of the tenant."""
        return list(self._json(Req("GET", "/sterile-cells/inventory", retry=True), InventoryResponse).inventory)

    def events(
        self,
        *,
        after: str = "0",
        limit: int | None = None,
        type: str | None = None,
        pool: str | None = None,
        lease_id: uuid.UUID | str | None = None,
    ) -> EventsResponse:
        """One page of the event log (CONTRACT §16) after the event id
        ``after``, oldest first: the tenant's own events (an operator token
        adds its pools' member events). Store the last id processed and pass
        it as ``after`` to resume; ``next_after`` is where the next page
        starts. Older than the log's retention is EventsExpiredError."""
        q = _core.events_query(after, limit, type, pool, lease_id)
        return self._json(Req("GET", "/events" + q, retry=True), EventsResponse)

    def iter_events(self, *, after: str = "0", **filters: Any) -> Iterator[Event]:
        """Every event after ``after`` that the log holds now, page by page."""
        while True:
            page = self.events(after=after, **filters)
            yield from page.events
            if not page.events:
                return
            after = page.next_after

    def evidence(self, lease_id: uuid.UUID | str) -> Evidence:
        """What the plane verified about the lease's cell (CONTRACT §15)."""
        return self._json(Req("GET", _core.lease_path(lease_id, "/evidence"), retry=True), EvidenceResponse).evidence

    def egress(self, lease_id: uuid.UUID | str) -> list[EgressHost]:
        """The connections of the lease's cell through the egress gateway, by
        host (CONTRACT §22): empty for a cell without egress."""
        return self._json(Req("GET", _core.lease_path(lease_id, "/egress"), retry=True), EgressResponse).hosts

    def exec(
        self,
        proof: Proof,
        argv: list[str],
        *,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: User | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run a command in the cell and return its decoded result. Sent
        once; with ``idempotency_key`` a repeat returns the first answer.

        Each of stdout and stderr is cut at the server's cap (1 MiB unless
        configured otherwise) and ``truncated`` set; ``max_output_bytes``
        asks for another cap, up to the server's ceiling
        (``SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES``, default 16 MiB; above
        it the server answers ``InvalidRequestError``). More than 1 MiB
        cannot be combined with ``idempotency_key`` (the stored answer keeps
        at most 1 MiB per stream): that raises ``ValueError`` and nothing is
        sent."""
        body = _core.exec_body(proof, argv, stdin, env, cwd, user, timeout, max_output_bytes, idempotency_key)
        r = Req(
            "POST",
            _core.lease_path(proof.lease_id, "/exec"),
            _core.encode(body),
            idempotency_key=idempotency_key,
            timeout=_core.exec_timeout(timeout, self._timeout),
            max_response=_core.exec_response_cap(max_output_bytes),
        )
        return _core.decode_exec(self._json(r, ExecResponse))

    def exec_stream(
        self,
        proof: Proof,
        argv: list[str],
        *,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: User | None = None,
        timeout: float | None = None,
        max_output_bytes: int | None = None,
    ) -> Iterator[StreamEvent]:
        """Run a command and yield its output as it comes: ``OutputEvent``
        chunks, then one ``ExitEvent``. A failure after the command started
        raises its typed exception; a stream that ends without an exit raises
        ``StreamIncompleteError``. Closing the iterator early closes the
        stream (the server then stops the command). Sent once.
        ``max_output_bytes`` as for :meth:`exec`."""
        body = _core.exec_body(proof, argv, stdin, env, cwd, user, timeout, max_output_bytes)
        r = Req("POST", _core.lease_path(proof.lease_id, "/exec"), _core.encode(body), accept="text/event-stream", timeout=30.0)
        try:
            resp = self._open(r)
        except httpx.TransportError as e:
            raise TransportError(f"exec stream: {e}") from e
        try:
            ctype = resp.headers.get("content-type", "").split(";")[0].strip()
            if ctype != "text/event-stream":
                raise ProtocolError(f"exec: the server answered {ctype!r}, not an event stream")
            dec = _core.SSEDecoder(resp.headers.get("x-request-id"))
            try:
                for line in resp.iter_lines():
                    ev = dec.feed(line)
                    if ev is not None:
                        yield ev
                        if dec.done:
                            return
                ev = dec.feed("")
                if ev is not None:
                    yield ev
                    if dec.done:
                        return
            except httpx.TransportError as e:
                raise TransportError(f"exec stream: {e}") from e
            dec.end()
        finally:
            resp.close()

    def launch(
        self,
        proof: Proof,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: User | None = None,
    ) -> Launch:
        """Start the lease's one resident workload (retried: the server
        launches once per lease and answers an exact repeat with it)."""
        body = proof.body() | {"argv": list(argv), "cwd": cwd, "env": dict(env) if env else None, "user": user}
        r = Req("POST", _core.lease_path(proof.lease_id, "/launch"), _core.encode(body), retry=True)
        return self._json(r, LaunchResponse).launch

    def launch_status(self, lease_id: uuid.UUID | str) -> Launch:
        """The launched workload's status; ``NotFoundError`` when none."""
        return self._json(Req("GET", _core.lease_path(lease_id, "/launch"), retry=True), LaunchResponse).launch

    def wait_launch(self, lease_id: uuid.UUID | str, *, poll: float = 0.5, timeout: float | None = None) -> Launch:
        """Poll until the launched workload is terminal."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.launch_status(lease_id)
            if st.phase == "terminal":
                return st
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"lease {lease_id}: launch not terminal within {timeout} s")
            self._sleep(poll)

    def write_file(
        self,
        proof: Proof,
        path: str,
        content: UploadSource,
        *,
        mode: int | None = None,
        user: User | None = None,
    ) -> FileWriteResponse:
        """Stream ``content`` (bytes, a ``pathlib.Path`` or a binary file
        object) into a file of the cell; parents are created and the file is
        replaced atomically. Sent once, never retried."""
        proof_json = _core.encode(proof.body() | {"path": path, "mode": _core.file_mode(mode), "user": user})
        ctype, head, tail = _core.multipart_parts(proof_json)

        def gen() -> Iterator[bytes]:
            yield head
            yield from _core.iter_source(content)
            yield tail

        r = Req("POST", _core.lease_path(proof.lease_id, "/files/write"), content_type=ctype, timeout=max(self._timeout, 300))
        try:
            resp = self._open(r, gen())
        except httpx.TransportError as e:
            raise TransportError(f"files/write: {e}") from e
        try:
            data = _read_capped(resp)
        finally:
            resp.close()
        try:
            return FileWriteResponse.model_validate_json(data)
        except ValidationError:
            raise ProtocolError("files/write: undecodable response") from None

    def _open_read(self, proof: Proof, path: str, max_bytes: int | None, user: User | None) -> httpx.Response:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("negative max_bytes")
        body = proof.body() | {"path": path, "max_bytes": max_bytes or None, "user": user}
        r = Req(
            "POST",
            _core.lease_path(proof.lease_id, "/files/read"),
            _core.encode(body),
            retry=True,
            accept="application/octet-stream",
            timeout=max(self._timeout, 300),
        )
        resp = self._retrying(r, lambda: self._open(r))
        if "content-length" not in resp.headers:
            resp.close()
            raise ProtocolError("files/read: the answer has no Content-Length")
        return resp

    def read_file(self, proof: Proof, path: str, *, max_bytes: int | None = None, user: User | None = None) -> bytes:
        """The content of a file of the cell. A missing file raises
        ``CellFileNotFoundError``; one larger than ``max_bytes``
        ``PayloadTooLargeError``."""
        buf = bytearray()
        self.download_file(proof, path, buf, max_bytes=max_bytes, user=user)
        return bytes(buf)

    def download_file(
        self,
        proof: Proof,
        path: str,
        dest: str | os.PathLike[str] | IO[bytes] | bytearray,
        *,
        max_bytes: int | None = None,
        user: User | None = None,
    ) -> int:
        """Stream a file of the cell into ``dest`` (a path, created or
        replaced, or a binary file object) and return its size. A body cut
        short raises ``TransportError``, never a shorter file."""
        resp = self._open_read(proof, path, max_bytes, user)
        size = int(resp.headers["content-length"])
        try:
            with _sink(dest) as write:
                n = 0
                try:
                    for chunk in resp.iter_raw(_core.CHUNK):
                        n += len(chunk)
                        write(chunk)
                except httpx.TransportError as e:
                    raise TransportError(f"files/read: the content was cut short: {e}") from e
                if n != size:
                    raise TransportError(f"files/read: got {n} of {size} bytes")
            return n
        finally:
            resp.close()

    # Operator route.

    def pools(self) -> list[Pool]:
        """Every pool of the tenant with its member counts (operator token)."""
        return list(self._json(Req("GET", "/pools", retry=True), PoolsResponse).pools)


def _claim(cid: uuid.UUID, resp: ClaimResponse) -> Claim:
    if resp.lease is not None and resp.lease_attestation is None:
        raise ProtocolError("claim response has a lease without lease_attestation")
    if resp.lease is not None:
        return Claim(cid, resp.lease, resp.lease_attestation)
    return Claim(cid, None, None, resp.empty_reason)


def _final(e: BaseException, n: int, claim_id: uuid.UUID | None) -> SandboxwichError:
    out: SandboxwichError
    if isinstance(e, APIError):
        out = e
    else:
        out = TransportError(f"{type(e).__name__}: {e}" + (f" (gave up after {n} attempts)" if n > 1 else ""))
    if claim_id is not None:
        setattr(out, "claim_id", claim_id)  # noqa: B010 - read back as err.claim_id
    return out


def _read_capped(resp: httpx.Response, limit: int = _core.MAX_RESPONSE_BYTES) -> bytes:
    buf = bytearray()
    for chunk in resp.iter_bytes():
        buf += chunk
        if len(buf) > limit:
            raise ProtocolError(f"response larger than {limit} bytes")
    return bytes(buf)


class _sink:
    """A write function into a path (replaced atomically), a file object or a
    bytearray."""

    def __init__(self, dest: Any) -> None:
        self.dest = dest
        self.tmp: str | None = None
        self.f: Any = None

    def __enter__(self) -> Callable[[bytes], Any]:
        d = self.dest
        if isinstance(d, bytearray):
            return d.extend
        if isinstance(d, (str, os.PathLike)):
            path = os.fspath(d)
            self.tmp = path + ".sbw-partial-" + uuid.uuid4().hex[:8]
            self.f = open(self.tmp, "xb")
            return self.f.write  # type: ignore[no-any-return]
        return d.write  # type: ignore[no-any-return]

    def __exit__(self, t: Any, e: Any, tb: Any) -> None:
        if self.f is None:
            return
        self.f.close()
        assert self.tmp is not None
        if t is None:
            os.replace(self.tmp, os.fspath(self.dest))
        else:
            os.unlink(self.tmp)
