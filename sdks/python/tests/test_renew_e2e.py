"""Lease renewal (CONTRACT §20) against the real server: renew moves the
expiry and changes nothing else, its errors, and the keep-alive, sync and
async, holding a lease past the server's maximum lease."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

import sandboxwich
from conftest import SHORT_LEASE_SECONDS, Server, claim, release_and_wait
from sandboxwich import AsyncClient, LeaseRenewalError
from sandboxwich._core import Req, encode


def _now() -> datetime:
    return datetime.now(timezone.utc)


def test_renew_moves_expires_at_and_nothing_else(server: Server) -> None:
    with server.client() as c:
        cl = claim(c, server, "s-renew", lease_seconds=30)
        assert cl.lease is not None
        p = cl.proof()
        before = cl.lease.expires_at
        lz = c.renew(p, 200)
        assert lz.expires_at > before + timedelta(seconds=100)
        assert lz.expires_at <= _now() + timedelta(seconds=201)
        assert lz.model_dump(exclude={"expires_at"}) == cl.lease.model_dump(exclude={"expires_at"})
        # The attestation does not change: the same proof still holds, and
        # validate answers the lease as it is now.
        assert c.validate(p) == lz
        # Never shorter: a renewal asking less than what is left changes nothing.
        assert c.renew(p, 1).expires_at == lz.expires_at
        assert c.renew(p, 0).expires_at == lz.expires_at  # clamped to 1, as a claim's
        # A fenced claim retry answers the same lease with its current expiry.
        again = c.claim(
            server.release,
            organization_id=p.organization_id,
            workspace_id=p.workspace_id,
            thread_id=p.thread_id,
            runner_session_id=p.runner_session_id,
            lease_seconds=30,
            claim_id=cl.claim_id,
        )
        assert again.lease == lz and again.attestation == cl.attestation

        # Errors: a wrong fence, an unknown lease, a missing lease_seconds.
        with pytest.raises(sandboxwich.ConflictError):
            c.renew(dataclasses.replace(p, thread_id="another-thread"), 60)
        with pytest.raises(sandboxwich.ConflictError):
            c.renew(dataclasses.replace(p, generation=p.generation + 1), 60)
        with pytest.raises(sandboxwich.NotFoundError):
            c.renew(dataclasses.replace(p, lease_id=uuid.uuid4()), 60)
        r = Req("POST", f"/sterile-cell-leases/{p.lease_id}/renew", encode(p.body()))
        with pytest.raises(sandboxwich.InvalidRequestError) as e:
            c._json(r, sandboxwich.RenewResponse)
        assert e.value.status == 422
        with pytest.raises(TypeError):
            c.renew(p, 1.5)  # type: ignore[arg-type]
        assert c.validate(p) == lz  # nothing changed

        release_and_wait(c, cl)
        with pytest.raises(sandboxwich.ConflictError):
            c.renew(p, 60)


def test_renew_async(server: Server) -> None:
    with server.client() as c:
        cl = claim(c, server, "s-renew-async", lease_seconds=30)
    assert cl.lease is not None
    p = cl.proof()

    async def main() -> None:
        async with AsyncClient(server.url, token=server.token) as ac:
            lz = await ac.renew(p, 200)
            assert lz.expires_at > cl.lease.expires_at + timedelta(seconds=100)  # type: ignore[union-attr]
            assert (await ac.validate(p)).expires_at == lz.expires_at
            with pytest.raises(sandboxwich.ConflictError):
                await ac.renew(dataclasses.replace(p, workspace_id="another"), 60)
            await ac.release(p)
            with pytest.raises(sandboxwich.ConflictError):
                await ac.renew(p, 60)

    asyncio.run(main())
    with server.client() as c:
        c.wait_provider_absent(p.lease_id, poll=0.2, timeout=90)


def test_keep_alive_holds_a_lease_past_the_maximum(short_server: Server) -> None:
    """Three maximum leases long, with a file written at the start and read
    at the end, and a command every couple of seconds."""
    srv = short_server
    with srv.client() as c:
        cl = claim(c, srv, "s-keep-alive", lease_seconds=SHORT_LEASE_SECONDS)
        assert cl.lease is not None
        p = cl.proof()
        first = cl.lease.expires_at
        c.write_file(p, "/home/cell/mark", b"still here")
        with c.keep_alive(p, SHORT_LEASE_SECONDS, expires_at=first) as ka:
            end = time.monotonic() + 3 * SHORT_LEASE_SECONDS
            while time.monotonic() < end:
                assert ka.error is None, ka.error
                assert c.exec(p, ["true"], timeout=1).exit_code == 0
                time.sleep(2)
            assert _now() > first + timedelta(seconds=SHORT_LEASE_SECONDS)  # past the first expiry
            assert c.read_file(p, "/home/cell/mark") == b"still here"
        assert ka.error is None and not ka.running
        assert ka.renewals >= 3 and ka.expires_at is not None and ka.expires_at > first
        assert c.validate(p).expires_at == ka.expires_at
        st = release_and_wait(c, cl)
        assert st.state == "destroyed" and st.provider_absent


def test_keep_alive_stops_on_release_and_reports_a_refusal(short_server: Server) -> None:
    srv = short_server
    with srv.client() as c:
        cl = claim(c, srv, "s-keep-alive-stop", lease_seconds=SHORT_LEASE_SECONDS)
        p = cl.proof()
        ka = c.keep_alive(p, SHORT_LEASE_SECONDS)  # the first renewal at once
        _wait(lambda: ka.renewals >= 1)
        c.release(p)  # stops it: the 409 of a later renewal is no failure
        time.sleep(1)
        assert not ka.running and ka.error is None
        ka.stop()
        c.wait_provider_absent(p.lease_id, poll=0.2, timeout=90)

        # Revoked behind its back (another client): the next renewal is
        # refused, and the keep-alive says so.
        cl = claim(c, srv, "s-keep-alive-revoked", lease_seconds=SHORT_LEASE_SECONDS)
        p = cl.proof()
        with pytest.raises(LeaseRenewalError) as e, c.keep_alive(p, SHORT_LEASE_SECONDS) as ka:
            _wait(lambda: ka.renewals >= 1)
            with srv.client() as other:
                other.revoke(p.lease_id)
            _wait(lambda: ka.error is not None, timeout=3 * SHORT_LEASE_SECONDS)
        assert isinstance(e.value.cause, sandboxwich.ConflictError)
        assert "could not be renewed" in str(e.value)
        c.wait_provider_absent(p.lease_id, poll=0.2, timeout=90)


def test_async_keep_alive_holds_a_lease_past_the_maximum(short_server: Server) -> None:
    srv = short_server
    with srv.client() as c:
        cl = claim(c, srv, "s-keep-alive-async", lease_seconds=SHORT_LEASE_SECONDS)
    assert cl.lease is not None
    p = cl.proof()
    first = cl.lease.expires_at

    async def main() -> None:
        async with AsyncClient(srv.url, token=srv.token) as ac:
            async with ac.keep_alive(p, SHORT_LEASE_SECONDS, expires_at=first) as ka:
                end = time.monotonic() + 2 * SHORT_LEASE_SECONDS
                while time.monotonic() < end:
                    assert ka.error is None, ka.error
                    assert (await ac.exec(p, ["true"], timeout=1)).exit_code == 0
                    await asyncio.sleep(2)
            assert ka.error is None and ka.renewals >= 2 and not ka.running
            assert (await ac.validate(p)).expires_at > first + timedelta(seconds=SHORT_LEASE_SECONDS)
            await ac.release(p)
            await ac.wait_provider_absent(p.lease_id, poll=0.2, timeout=90)

    asyncio.run(main())


def _wait(cond: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.1)
