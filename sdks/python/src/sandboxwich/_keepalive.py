"""Keep-alive of a lease (CONTRACT §20): renew before expiry, at about a
third of the remaining life, until stopped or released; a failed renewal is
reported to the caller. :class:`KeepAlive` runs in a thread (for
:class:`~sandboxwich.Client`), :class:`AsyncKeepAlive` in an asyncio task
(for :class:`~sandboxwich.AsyncClient`); both share :class:`_Schedule`."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from types import TracebackType
from typing import TYPE_CHECKING

from . import _core
from .errors import APIError, LeaseRenewalError, SandboxwichError, TransportError
from .models import Lease

if TYPE_CHECKING:
    from ._core import Proof

MIN_INTERVAL = 0.25
"""The shortest wait between two renewals, in seconds."""

_FAILURE_WAIT = 1.0
"""The longest wait before trying again after a transient failure."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


class _Schedule:
    """When to renew next, from the answers so far. Not thread-safe: its
    owner (one thread or one task) alone calls it."""

    def __init__(self, lease_id: uuid.UUID, expires_at: datetime | None) -> None:
        self.lease_id = lease_id
        self.expires_at = expires_at
        self.lease: Lease | None = None
        self.renewals = 0
        self.last_wait = 0.0
        self.stalled = False
        """The last renewal did not move the expiry (the lifetime cap, or a
        lease_seconds shorter than the remaining life)."""

    def first_wait(self) -> float:
        """Before the first renewal: at once, or a third of the remaining
        life of a known expiry."""
        if self.expires_at is None:
            return 0.0
        return self._third(self.expires_at)

    def _third(self, expires_at: datetime) -> float:
        left = (expires_at - _now()).total_seconds()
        return max(MIN_INTERVAL, left / 3)

    def renewed(self, lease: Lease) -> float:
        """Record an answer; the wait before the next renewal. When the
        expiry did not move, the wait is never shorter than the previous
        one, so a lease held at its lifetime cap is renewed a few more
        times, not in a loop that speeds up as the expiry nears."""
        prev = self.expires_at
        self.lease = lease
        self.renewals += 1
        self.stalled = prev is not None and lease.expires_at <= prev
        if prev is None or lease.expires_at > prev:
            self.expires_at = lease.expires_at
        wait = self._third(lease.expires_at)
        if self.stalled:
            wait = max(wait, self.last_wait)
        self.last_wait = wait
        return wait

    def left(self) -> float:
        """Seconds until the last known expiry (negative once past it)."""
        if self.expires_at is None:
            return float("inf")
        return (self.expires_at - _now()).total_seconds()

    def failed(self, err: BaseException) -> tuple[LeaseRenewalError | None, float]:
        """After a renewal failed (the client's own retries spent): the
        error to report, or None and the wait before trying again. A
        transient failure (transport, 5xx, 429) is tried again while the
        lease may still be live; anything else ends the keep-alive."""
        transient = isinstance(err, TransportError) or (isinstance(err, APIError) and _core.retryable(err))
        left = self.left()
        if not transient:
            return LeaseRenewalError(self.lease_id, str(err), err, expired=left <= 0), 0.0
        if left <= 0:
            return LeaseRenewalError(self.lease_id, f"the lease expired at {self.expires_at} before a renewal got through ({err})", err, expired=True), 0.0
        return None, min(_FAILURE_WAIT, max(MIN_INTERVAL, left / 3))

    def expired_at_cap(self) -> LeaseRenewalError | None:
        """The error of a lease whose expiry stopped moving and has passed:
        renewing it again would only be refused."""
        if self.stalled and self.left() <= 0:
            return LeaseRenewalError(
                self.lease_id,
                f"the lease expired at {self.expires_at}: renewals no longer extended it (the cell's lifetime cap)",
                None,
                expired=True,
            )
        return None


class KeepAlive:
    """Keeps one lease alive from a background thread until stopped (see
    :meth:`sandboxwich.Client.keep_alive`). Use it as a context manager, or
    call :meth:`stop` when done.

    ``lease`` and ``expires_at`` are the last renewal's answer; ``error``
    is the :class:`LeaseRenewalError` that ended it, if one did (a failed
    renewal is never retried past it); :meth:`check` raises it. Leaving the
    ``with`` block stops it and raises ``error`` unless the block raised
    already. :meth:`sandboxwich.Client.release` and
    :meth:`~sandboxwich.Client.revoke` of the lease stop it quietly (a
    renewal answered 409 after the release is no failure), and so does
    :meth:`~sandboxwich.Client.close`."""

    def __init__(
        self,
        renew: Callable[[Proof, int], Lease],
        proof: Proof,
        lease_seconds: int,
        expires_at: datetime | None,
        on_stop: Callable[[KeepAlive], None],
    ) -> None:
        _check_seconds(lease_seconds)
        self.lease_id = proof.lease_id
        self.lease_seconds = lease_seconds
        self._renew = renew
        self._proof = proof
        self._schedule = _Schedule(proof.lease_id, expires_at)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._error: LeaseRenewalError | None = None
        self._on_stop = on_stop
        self._thread = threading.Thread(target=self._run, name=f"sandboxwich-keep-alive-{proof.lease_id}", daemon=True)

    def _start(self) -> None:
        self._thread.start()

    def __repr__(self) -> str:
        state = "failed" if self._error else "stopped" if self._stopping.is_set() else "running"
        return f"KeepAlive(lease_id={self.lease_id}, {state}, expires_at={self.expires_at})"

    @property
    def lease(self) -> Lease | None:
        with self._lock:
            return self._schedule.lease

    @property
    def expires_at(self) -> datetime | None:
        with self._lock:
            return self._schedule.expires_at

    @property
    def renewals(self) -> int:
        """How many renewals the server answered."""
        with self._lock:
            return self._schedule.renewals

    @property
    def error(self) -> LeaseRenewalError | None:
        with self._lock:
            return self._error

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set()

    def check(self) -> None:
        """Raise the renewal failure, if there was one."""
        err = self.error
        if err is not None:
            raise err

    def halt(self) -> None:
        """Stop renewing without waiting for a renewal in flight (whose
        outcome is then ignored)."""
        self._stopping.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop renewing and wait for the thread to end (at most
        ``timeout`` seconds). Idempotent; never raises the renewal failure
        (see :meth:`check`)."""
        self._stopping.set()
        if self._thread.ident is not None and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> KeepAlive:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
        if t is None:
            self.check()

    def _fail(self, err: LeaseRenewalError) -> None:
        with self._lock:
            if not self._stopping.is_set():
                self._error = err

    def _run(self) -> None:
        try:
            with self._lock:
                wait = self._schedule.first_wait()
            while not self._stopping.wait(wait):
                with self._lock:
                    err = self._schedule.expired_at_cap()
                if err is not None:
                    self._fail(err)
                    return
                try:
                    lz = self._renew(self._proof, self.lease_seconds)
                except SandboxwichError as e:
                    with self._lock:
                        fatal, wait = self._schedule.failed(e)
                    if fatal is not None:
                        self._fail(fatal)
                        return
                    continue
                except Exception as e:  # a closed client, a bug: reported, not lost in the thread
                    self._fail(LeaseRenewalError(self.lease_id, f"{type(e).__name__}: {e}", e))
                    return
                with self._lock:
                    wait = self._schedule.renewed(lz)
        finally:
            self._on_stop(self)


class AsyncKeepAlive:
    """The asyncio twin of :class:`KeepAlive` (see
    :meth:`sandboxwich.AsyncClient.keep_alive`): renewals run in a task of
    the running event loop. ``async with`` it, or ``await`` :meth:`stop`."""

    def __init__(
        self,
        renew: Callable[[Proof, int], Awaitable[Lease]],
        proof: Proof,
        lease_seconds: int,
        expires_at: datetime | None,
        on_stop: Callable[[AsyncKeepAlive], None],
    ) -> None:
        _check_seconds(lease_seconds)
        self.lease_id = proof.lease_id
        self.lease_seconds = lease_seconds
        self._renew = renew
        self._proof = proof
        self._schedule = _Schedule(proof.lease_id, expires_at)
        self._stopping = asyncio.Event()
        self._error: LeaseRenewalError | None = None
        self._on_stop = on_stop
        self._task: asyncio.Task[None] | None = None

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"sandboxwich-keep-alive-{self.lease_id}")

    def __repr__(self) -> str:
        state = "failed" if self._error else "stopped" if self._stopping.is_set() else "running"
        return f"AsyncKeepAlive(lease_id={self.lease_id}, {state}, expires_at={self.expires_at})"

    @property
    def lease(self) -> Lease | None:
        return self._schedule.lease

    @property
    def expires_at(self) -> datetime | None:
        return self._schedule.expires_at

    @property
    def renewals(self) -> int:
        return self._schedule.renewals

    @property
    def error(self) -> LeaseRenewalError | None:
        return self._error

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and not self._stopping.is_set()

    def check(self) -> None:
        """Raise the renewal failure, if there was one."""
        if self._error is not None:
            raise self._error

    def halt(self) -> None:
        """Stop renewing; a renewal in flight is cancelled."""
        self._stopping.set()
        if self._task is not None and asyncio.current_task() is not self._task:
            self._task.cancel()

    async def stop(self) -> None:
        """Stop renewing and wait for the task to end. Idempotent; never
        raises the renewal failure (see :meth:`check`)."""
        self.halt()
        if self._task is not None and asyncio.current_task() is not self._task:
            # The task's own cancellation is its normal end here; the
            # caller's cancellation still propagates.
            await asyncio.gather(self._task, return_exceptions=True)

    async def __aenter__(self) -> AsyncKeepAlive:
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()
        if t is None:
            self.check()

    def _fail(self, err: LeaseRenewalError) -> None:
        if not self._stopping.is_set():
            self._error = err

    async def _sleep(self, wait: float) -> bool:
        """Wait; True when stopped meanwhile."""
        try:
            await asyncio.wait_for(self._stopping.wait(), wait)
            return True
        except asyncio.TimeoutError:
            return self._stopping.is_set()

    async def _run(self) -> None:
        try:
            wait = self._schedule.first_wait()
            while not await self._sleep(wait):
                err = self._schedule.expired_at_cap()
                if err is not None:
                    self._fail(err)
                    return
                try:
                    lz = await self._renew(self._proof, self.lease_seconds)
                except SandboxwichError as e:
                    fatal, wait = self._schedule.failed(e)
                    if fatal is not None:
                        self._fail(fatal)
                        return
                    continue
                except Exception as e:
                    self._fail(LeaseRenewalError(self.lease_id, f"{type(e).__name__}: {e}", e))
                    return
                wait = self._schedule.renewed(lz)
        finally:
            self._on_stop(self)


def _check_seconds(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError("lease_seconds is a positive whole number of seconds")
