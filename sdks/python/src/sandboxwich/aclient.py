"""The asynchronous client: :class:`Client`'s calls, awaited."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import IO, Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from . import _core
from ._core import Claim, LeasePage, Proof, Req, RetryPolicy, StreamEvent, UploadSource
from ._keepalive import AsyncKeepAlive
from .client import _claim, _final, _sink
from .errors import APIError, ProtocolError, TransportError
from .models import (
    ClaimResponse,
    Disposition,
    EgressHost,
    EgressResponse,
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


class AsyncClient:
    """The asynchronous twin of :class:`sandboxwich.Client`: the same calls,
    arguments, retry rules and exceptions, awaited. Cancelling a call
    (``asyncio`` cancellation) stops it at once, between or during
    attempts; a cancelled claim may still have leased a cell, so claim again
    with the same ``claim_id`` to learn its outcome (the fence returns the
    same lease)."""

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
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if token_file is not None:
            token = _core.read_secret_file(token_file)
        if operator_token_file is not None:
            operator_token = _core.read_secret_file(operator_token_file)
        self._base = _core.base_url(base_url)
        self._retry = retry or RetryPolicy()
        self._timeout = timeout
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            headers=_core.auth_headers(token, operator_token),
            timeout=httpx.Timeout(timeout, connect=10.0),
            transport=transport,
            follow_redirects=False,
        )
        self._keepalives: dict[uuid.UUID, list[AsyncKeepAlive]] = {}

    def __repr__(self) -> str:
        return f"sandboxwich.AsyncClient({self._base!r})"

    async def aclose(self) -> None:
        """Close the connections; every keep-alive of this client stops."""
        kas = [k for ks in self._keepalives.values() for k in ks]
        for k in kas:
            await k.stop()
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def _open(self, r: Req, content: Any = None) -> httpx.Response:
        headers = {"Accept": r.accept}
        body = content if content is not None else r.body
        if body is not None:
            headers["Content-Type"] = r.content_type
        if r.idempotency_key:
            headers[_core.IDEMPOTENCY_HEADER] = r.idempotency_key
        timeout = httpx.Timeout(r.timeout or self._timeout, connect=10.0)
        req = self._http.build_request(r.method, self._base + "/v1" + r.path, content=body, headers=headers, timeout=timeout)
        resp = await self._http.send(req, stream=True)
        if 200 <= resp.status_code <= 299:
            return resp
        try:
            data = await _aread_capped(resp)
        finally:
            await resp.aclose()
        raise _core.error_from(resp, data)

    async def _retrying(self, r: Req, attempt: Callable[[], Awaitable[T]], claim_id: uuid.UUID | None = None) -> T:
        attempts = self._retry.max_attempts if r.retry else 1
        n = 1
        while True:
            try:
                return await attempt()
            except (httpx.TransportError, APIError) as e:
                if not _core.retryable(e) or n >= attempts:
                    raise _final(e, n, claim_id) from e
                wait = e.retry_after if isinstance(e, APIError) and e.retry_after > 0 else self._retry.backoff(n)
                await self._sleep(wait)
                n += 1

    async def _json(self, r: Req, model: type[M], claim_id: uuid.UUID | None = None) -> M:
        async def attempt() -> M:
            resp = await self._open(r)
            try:
                data = await _aread_capped(resp, r.max_response)
            finally:
                await resp.aclose()
            try:
                return model.model_validate_json(data)
            except ValidationError as e:
                raise ProtocolError(f"{r.method} {r.path.split('?')[0]}: decoding the {resp.status_code} response: {e.error_count()} errors") from None

        return await self._retrying(r, attempt, claim_id)

    async def health(self) -> Health:
        return await self._json(Req("GET", "/readyz", retry=True), Health)

    async def claim(
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
        """See :meth:`sandboxwich.Client.claim` (``image``, ``wait_seconds``, ``egress``
        and the read timeout of a waiting claim included). Cancelling a
        waiting claim stops the call; the server's wait goes on, and a claim
        with the same ``claim_id`` and arguments joins it."""
        cid = claim_id or _core.uuid7()
        r = _core.claim_req(
            release, organization_id, workspace_id, thread_id, runner_session_id, lease_seconds, cid, image, wait_seconds, self._timeout, egress
        )
        return _claim(cid, await self._json(r, ClaimResponse, cid))

    async def validate(self, proof: Proof) -> Lease:
        r = Req("POST", _core.lease_path(proof.lease_id, "/validate"), _core.encode(proof.body()), retry=True)
        return (await self._json(r, ValidateResponse)).lease

    async def renew(self, proof: Proof, lease_seconds: int) -> Lease:
        """See :meth:`sandboxwich.Client.renew`."""
        if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int):
            raise TypeError("lease_seconds is a whole number of seconds")
        body = proof.body() | {"lease_seconds": lease_seconds}
        r = Req("POST", _core.lease_path(proof.lease_id, "/renew"), _core.encode(body), retry=True)
        return (await self._json(r, RenewResponse)).lease

    def keep_alive(self, proof: Proof, lease_seconds: int, *, expires_at: datetime | None = None) -> AsyncKeepAlive:
        """Keep the lease alive from a task of the running event loop; see
        :meth:`sandboxwich.Client.keep_alive` (the same schedule, errors and
        stops). ``async with client.keep_alive(proof, 300) as ka: ...``, or
        ``await ka.stop()``; ``ka.error`` holds a failed renewal. Call it
        from a coroutine (it needs the running loop)."""
        ka = AsyncKeepAlive(self.renew, proof, lease_seconds, expires_at, self._forget_keep_alive)
        self._keepalives.setdefault(proof.lease_id, []).append(ka)
        ka._start()
        return ka

    def _forget_keep_alive(self, ka: AsyncKeepAlive) -> None:
        kas = self._keepalives.get(ka.lease_id, [])
        if ka in kas:
            kas.remove(ka)
        if not kas:
            self._keepalives.pop(ka.lease_id, None)

    def _halt_keep_alives(self, lease_id: uuid.UUID) -> None:
        for k in list(self._keepalives.get(lease_id, [])):
            k.halt()

    async def release(self, proof: Proof, disposition: Disposition = "destroyed") -> LeaseStatus:
        self._halt_keep_alives(proof.lease_id)
        body = proof.body() | {"disposition": disposition}
        r = Req("POST", _core.lease_path(proof.lease_id, "/release"), _core.encode(body))
        return (await self._json(r, StatusResponse)).status

    async def lease(self, lease_id: uuid.UUID | str) -> LeaseStatus:
        return (await self._json(Req("GET", _core.lease_path(lease_id), retry=True), StatusResponse)).status

    async def wait_provider_absent(self, lease_id: uuid.UUID | str, *, poll: float = 0.5, timeout: float | None = None) -> LeaseStatus:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                st = await self.lease(lease_id)
                if st.provider_absent:
                    return st
            except TransportError:
                pass
            except APIError as e:
                if not _core.retryable(e):
                    raise
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"lease {lease_id}: provider_absent not proven within {timeout} s")
            await self._sleep(poll)

    async def list_leases(
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
        q = _core.list_query(organization_id, workspace_id, thread_id, runner_session_id, live, limit, cursor)
        resp = await self._json(Req("GET", "/sterile-cell-leases" + q, retry=True), LeasesResponse)
        return LeasePage(list(resp.leases), resp.next_cursor)

    async def iter_leases(self, **filters: Any) -> AsyncIterator[LeaseSummary]:
        cursor = None
        while True:
            page = await self.list_leases(cursor=cursor, **filters)
            for lz in page.leases:
                yield lz
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def revoke(self, lease_id: uuid.UUID | str, disposition: Disposition | None = None) -> LeaseStatus:
        self._halt_keep_alives(uuid.UUID(str(lease_id)))
        r = Req("POST", _core.lease_path(lease_id, "/revoke"), _core.encode({"disposition": disposition}))
        return (await self._json(r, StatusResponse)).status

    async def inventory(self) -> list[InventoryEntry]:
        return list((await self._json(Req("GET", "/sterile-cells/inventory", retry=True), InventoryResponse)).inventory)

    async def events(
        self,
        *,
        after: str = "0",
        limit: int | None = None,
        type: str | None = None,
        pool: str | None = None,
        lease_id: uuid.UUID | str | None = None,
    ) -> EventsResponse:
        """One page of the event log after ``after``; see :meth:`Client.events`."""
        q = _core.events_query(after, limit, type, pool, lease_id)
        return await self._json(Req("GET", "/events" + q, retry=True), EventsResponse)

    async def evidence(self, lease_id: uuid.UUID | str) -> Evidence:
        return (await self._json(Req("GET", _core.lease_path(lease_id, "/evidence"), retry=True), EvidenceResponse)).evidence

    async def egress(self, lease_id: uuid.UUID | str) -> list[EgressHost]:
        """See :meth:`sandboxwich.Client.egress`."""
        return (await self._json(Req("GET", _core.lease_path(lease_id, "/egress"), retry=True), EgressResponse)).hosts

    async def exec(
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
        body = _core.exec_body(proof, argv, stdin, env, cwd, user, timeout, max_output_bytes, idempotency_key)
        r = Req(
            "POST",
            _core.lease_path(proof.lease_id, "/exec"),
            _core.encode(body),
            idempotency_key=idempotency_key,
            timeout=_core.exec_timeout(timeout, self._timeout),
            max_response=_core.exec_response_cap(max_output_bytes),
        )
        return _core.decode_exec(await self._json(r, ExecResponse))

    async def exec_stream(
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
    ) -> AsyncIterator[StreamEvent]:
        body = _core.exec_body(proof, argv, stdin, env, cwd, user, timeout, max_output_bytes)
        r = Req("POST", _core.lease_path(proof.lease_id, "/exec"), _core.encode(body), accept="text/event-stream", timeout=30.0)
        try:
            resp = await self._open(r)
        except httpx.TransportError as e:
            raise TransportError(f"exec stream: {e}") from e
        try:
            ctype = resp.headers.get("content-type", "").split(";")[0].strip()
            if ctype != "text/event-stream":
                raise ProtocolError(f"exec: the server answered {ctype!r}, not an event stream")
            dec = _core.SSEDecoder(resp.headers.get("x-request-id"))
            try:
                async for line in resp.aiter_lines():
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
            await resp.aclose()

    async def launch(
        self,
        proof: Proof,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: User | None = None,
    ) -> Launch:
        body = proof.body() | {"argv": list(argv), "cwd": cwd, "env": dict(env) if env else None, "user": user}
        r = Req("POST", _core.lease_path(proof.lease_id, "/launch"), _core.encode(body), retry=True)
        return (await self._json(r, LaunchResponse)).launch

    async def launch_status(self, lease_id: uuid.UUID | str) -> Launch:
        return (await self._json(Req("GET", _core.lease_path(lease_id, "/launch"), retry=True), LaunchResponse)).launch

    async def wait_launch(self, lease_id: uuid.UUID | str, *, poll: float = 0.5, timeout: float | None = None) -> Launch:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = await self.launch_status(lease_id)
            if st.phase == "terminal":
                return st
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"lease {lease_id}: launch not terminal within {timeout} s")
            await self._sleep(poll)

    async def write_file(
        self,
        proof: Proof,
        path: str,
        content: UploadSource,
        *,
        mode: int | None = None,
        user: User | None = None,
    ) -> FileWriteResponse:
        proof_json = _core.encode(proof.body() | {"path": path, "mode": _core.file_mode(mode), "user": user})
        ctype, head, tail = _core.multipart_parts(proof_json)

        async def gen() -> AsyncIterator[bytes]:
            yield head
            for chunk in _core.iter_source(content):
                yield chunk
            yield tail

        r = Req("POST", _core.lease_path(proof.lease_id, "/files/write"), content_type=ctype, timeout=max(self._timeout, 300))
        try:
            resp = await self._open(r, gen())
        except httpx.TransportError as e:
            raise TransportError(f"files/write: {e}") from e
        try:
            data = await _aread_capped(resp)
        finally:
            await resp.aclose()
        try:
            return FileWriteResponse.model_validate_json(data)
        except ValidationError:
            raise ProtocolError("files/write: undecodable response") from None

    async def read_file(self, proof: Proof, path: str, *, max_bytes: int | None = None, user: User | None = None) -> bytes:
        buf = bytearray()
        await self.download_file(proof, path, buf, max_bytes=max_bytes, user=user)
        return bytes(buf)

    async def download_file(
        self,
        proof: Proof,
        path: str,
        dest: str | os.PathLike[str] | IO[bytes] | bytearray,
        *,
        max_bytes: int | None = None,
        user: User | None = None,
    ) -> int:
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
        resp = await self._retrying(r, lambda: self._open(r))
        try:
            if "content-length" not in resp.headers:
                raise ProtocolError("files/read: the answer has no Content-Length")
            size = int(resp.headers["content-length"])
            with _sink(dest) as write:
                n = 0
                try:
                    async for chunk in resp.aiter_raw(_core.CHUNK):
                        n += len(chunk)
                        write(chunk)
                except httpx.TransportError as e:
                    raise TransportError(f"files/read: the content was cut short: {e}") from e
                if n != size:
                    raise TransportError(f"files/read: got {n} of {size} bytes")
            return n
        finally:
            await resp.aclose()

    async def pools(self) -> list[Pool]:
        return list((await self._json(Req("GET", "/pools", retry=True), PoolsResponse)).pools)


async def _aread_capped(resp: httpx.Response, limit: int = _core.MAX_RESPONSE_BYTES) -> bytes:
    buf = bytearray()
    async for chunk in resp.aiter_bytes():
        buf += chunk
        if len(buf) > limit:
            raise ProtocolError(f"response larger than {limit} bytes")
    return bytes(buf)
