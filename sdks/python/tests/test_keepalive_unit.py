"""The keep-alive's schedule, without a server: renewals at about a third of
the remaining life, no busy loop once the expiry stops moving (the lifetime
cap), transient failures retried until expiry, refusals reported. The
renewal itself is a plain function here; test_renew_e2e.py runs the
keep-alive against the real server."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

import sandboxwich
from sandboxwich import Attestation, Lease, LeaseRenewalError, Proof, Release
from sandboxwich._keepalive import MIN_INTERVAL, AsyncKeepAlive, KeepAlive, _Schedule

LEASE_ID = uuid.uuid4()
PROOF = Proof(LEASE_ID, Attestation("swla1_" + "A" * 43), 2, "o", "w", "t", "r")


def _lease(expires_at: datetime) -> Lease:
    rel = Release(release_set_id="r", runtime_class="gvisor_lower_risk", policy_digest="0" * 64, signature="swrs1_x")
    return Lease(
        lease_id=LEASE_ID,
        cell_id=uuid.uuid4(),
        generation=2,
        release=rel,
        organization_id="o",
        workspace_id="w",
        thread_id="t",
        runner_session_id="r",
        expires_at=expires_at,
    )


def _now() -> datetime:
    return datetime.now(timezone.utc)


def test_schedule_renews_at_a_third_and_never_speeds_up_when_stalled() -> None:
    s = _Schedule(LEASE_ID, None)
    assert s.first_wait() == 0.0
    w = s.renewed(_lease(_now() + timedelta(seconds=30)))
    assert 9 < w <= 10
    # The expiry stops moving (the lifetime cap): the wait stays at least
    # the previous one, however close the expiry comes.
    cap = _now() + timedelta(seconds=33)
    w1 = s.renewed(_lease(cap))
    assert not s.stalled and 10 < w1 <= 11
    time.sleep(0.3)
    w2 = s.renewed(_lease(cap))
    assert s.stalled and w2 >= w1
    # An answer earlier than the known expiry never moves it back.
    s.renewed(_lease(cap - timedelta(seconds=5)))
    assert s.stalled and s.expires_at == cap
    assert s.expired_at_cap() is None
    s.expires_at = _now() - timedelta(seconds=1)
    err = s.expired_at_cap()
    assert err is not None and err.expired and "lifetime cap" in str(err)


def test_schedule_failures() -> None:
    s = _Schedule(LEASE_ID, _now() + timedelta(seconds=9))
    assert 2.9 < s.first_wait() <= 3
    fatal, wait = s.failed(sandboxwich.TransportError("reset"))
    assert fatal is None and MIN_INTERVAL <= wait <= 1.0
    fatal, wait = s.failed(sandboxwich.InternalError(503, "store_unavailable", "down"))
    assert fatal is None
    fatal, _ = s.failed(sandboxwich.ConflictError(409, "conflict", "no longer live"))
    assert fatal is not None and isinstance(fatal.cause, sandboxwich.ConflictError) and not fatal.expired
    s.expires_at = _now() - timedelta(seconds=1)
    fatal, _ = s.failed(sandboxwich.TransportError("reset"))
    assert fatal is not None and fatal.expired and "expired" in str(fatal)


def test_keep_alive_at_the_cap_renews_a_few_times_then_reports_expiry() -> None:
    cap = _now() + timedelta(seconds=1.5)
    calls: list[float] = []

    def renew(p: Proof, n: int) -> Lease:
        assert p is PROOF and n == 60
        calls.append(time.monotonic())
        return _lease(cap)

    stopped = threading.Event()
    ka = KeepAlive(renew, PROOF, 60, None, lambda k: stopped.set())
    ka._start()
    assert stopped.wait(10)
    assert len(calls) <= 8, calls  # no busy loop near the expiry
    assert ka.error is not None and ka.error.expired and "lifetime cap" in ka.error.message
    with pytest.raises(LeaseRenewalError):
        ka.check()


def test_keep_alive_stops_quietly_and_raises_on_exit() -> None:
    gate = threading.Event()

    def refused(p: Proof, n: int) -> Lease:
        gate.set()
        raise sandboxwich.ConflictError(409, "conflict", "no longer live")

    with pytest.raises(LeaseRenewalError) as e, KeepAlive(refused, PROOF, 5, None, lambda k: None) as ka:
        ka._start()
        assert gate.wait(5)
        ka._thread.join(5)
    assert isinstance(e.value.cause, sandboxwich.ConflictError)

    # Halted (a release) while its renewal is refused: no error.
    def slow_refusal(p: Proof, n: int) -> Lease:
        gate.set()
        time.sleep(0.3)
        raise sandboxwich.ConflictError(409, "conflict", "no longer live")

    gate.clear()
    ka = KeepAlive(slow_refusal, PROOF, 5, None, lambda k: None)
    ka._start()
    assert gate.wait(5)
    ka.halt()
    ka.stop()
    assert ka.error is None and not ka.running


def test_async_keep_alive_renews_and_stops() -> None:
    async def main() -> None:
        n = 0

        async def renew(p: Proof, secs: int) -> Lease:
            nonlocal n
            n += 1
            return _lease(_now() + timedelta(seconds=0.9))

        ka = AsyncKeepAlive(renew, PROOF, 1, None, lambda k: None)
        ka._start()
        async with ka:
            await asyncio.sleep(1.2)
        assert 2 <= n <= 8 and ka.error is None and not ka.running

        async def refused(p: Proof, secs: int) -> Lease:
            raise sandboxwich.NotFoundError(404, "not_found", "no such lease")

        ka = AsyncKeepAlive(refused, PROOF, 1, None, lambda k: None)
        ka._start()
        with pytest.raises(LeaseRenewalError):
            async with ka:
                await asyncio.sleep(0.2)

    asyncio.run(main())


def test_lease_seconds_must_be_positive() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            KeepAlive(lambda p, n: _lease(_now()), PROOF, bad, None, lambda k: None)  # type: ignore[arg-type]
