"""Claims that wait and claims of an image (CONTRACT §21) against the real
server: a claim that waits while the pool has no ready cell gets the cell
that comes when one is released; a wait that elapses is empty with
empty_reason wait_elapsed (and replays so); a waiting claim outlasts the
client's own read timeout; the server's range of wait_seconds; an image
with a tag is image_not_allowed and nothing is recorded; a claim of the
pool's image gets a cell of it. Sync and async."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest

import sandboxwich
from conftest import Server, release_and_wait, release_one, wait_ready
from sandboxwich import AsyncClient, Client, RetryPolicy

BINDING: dict[str, Any] = {"organization_id": "org-py", "workspace_id": "ws-wait", "thread_id": "th-wait"}
DIGEST = "sha256:" + "d" * 64


def _end(server: Server, *claims: sandboxwich.Claim) -> None:
    with server.client() as c:
        for cl in claims:
            release_and_wait(c, cl)


def test_a_waiting_claim_gets_the_cell_that_comes(server: Server, held: list[sandboxwich.Claim]) -> None:
    got: dict[str, object] = {}

    def waiter() -> None:
        with server.client() as c:
            t0 = time.monotonic()
            got["claim"] = c.claim(server.release, **BINDING, runner_session_id="s-waiter", wait_seconds=120)
            got["took"] = time.monotonic() - t0

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(2)
    assert t.is_alive(), got  # it waits: no cell is ready
    release_one(server, held[0])
    t.join(timeout=150)
    assert not t.is_alive()
    cl = got["claim"]
    assert isinstance(cl, sandboxwich.Claim) and cl.lease is not None and cl.empty_reason is None
    assert isinstance(got["took"], float) and got["took"] >= 2
    assert cl.lease.cell_id not in {h.lease.cell_id for h in held if h.lease}  # a new cell, made after the release
    with server.client() as c:
        leases = c.list_leases(runner_session_id="s-waiter").leases
        assert [lz.lease_id for lz in leases] == [cl.lease.lease_id]  # one claim, one lease
        assert c.exec(cl.proof(), ["echo", "waited"]).stdout == b"waited\n"
    _end(server, cl)


def test_a_wait_that_elapses_is_empty_wait_elapsed_and_outlasts_the_read_timeout(server: Server, held: list[sandboxwich.Claim]) -> None:
    # The client's read timeout (1 s) is shorter than the wait (3 s): the
    # claim's own timeout outlasts it. No retries, so a timeout would show.
    with Client(server.url, token=server.token, timeout=1.0, retry=RetryPolicy(1)) as c:
        cid = sandboxwich.uuid7()
        t0 = time.monotonic()
        cl = c.claim(server.release, **BINDING, runner_session_id="s-elapse", wait_seconds=3, claim_id=cid)
        took = time.monotonic() - t0
        assert cl.empty and cl.lease is None and cl.attestation is None
        assert cl.empty_reason == "wait_elapsed" and cl.claim_id == cid
        assert 3 <= took < 20, took
        # The outcome is durable: a replay (the same claim_id and body) answers the same at once.
        t0 = time.monotonic()
        again = c.claim(server.release, **BINDING, runner_session_id="s-elapse", wait_seconds=3, claim_id=cid)
        assert again.empty and again.empty_reason == "wait_elapsed" and time.monotonic() - t0 < 2
        # Another body under that claim_id is a different claim: 409.
        with pytest.raises(sandboxwich.ConflictError):
            c.claim(server.release, **BINDING, runner_session_id="s-elapse", wait_seconds=4, claim_id=cid)
        # A claim that does not wait answers at once; empty_reason only with image or a wait.
        plain = c.claim(server.release, **BINDING, runner_session_id="s-elapse")
        assert plain.empty and plain.empty_reason is None


def test_wait_seconds_outside_0_to_300_is_the_servers_invalid_request(server: Server) -> None:
    with server.client() as c:
        for bad in (301, 100000, -1):
            with pytest.raises(sandboxwich.InvalidRequestError) as ei:
                c.claim(server.release, **BINDING, runner_session_id="s-range", wait_seconds=bad)
            assert ei.value.status == 422, bad
        assert c.list_leases(runner_session_id="s-range").leases == []


def test_an_image_with_a_tag_is_image_not_allowed_and_nothing_is_recorded(server: Server) -> None:
    with server.client() as c:
        wait_ready(c, 1)
        cid = sandboxwich.uuid7()
        for image in ("127.0.0.1:5000/python:3.12", f"127.0.0.1:5000/python@{DIGEST}"):  # a tag; a digest no pool serves
            with pytest.raises(sandboxwich.ImageNotAllowedError) as ei:
                c.claim(server.release, **BINDING, runner_session_id="s-tag", image=image, wait_seconds=5, claim_id=cid)
            assert ei.value.status == 422 and ei.value.claim_id == cid  # type: ignore[attr-defined]
        # Nothing was recorded under that claim_id: another claim with it is no conflict.
        cl = c.claim(server.release, **BINDING, runner_session_id="s-tag", claim_id=cid, wait_seconds=60)
        assert cl.lease is not None
        release_and_wait(c, cl)


def test_async_wait_and_image_not_allowed(server: Server, held: list[sandboxwich.Claim]) -> None:
    async def main() -> sandboxwich.Claim:
        async with AsyncClient(server.url, token=server.token, timeout=1.0, retry=RetryPolicy(1)) as c:
            t0 = time.monotonic()
            empty = await c.claim(server.release, **BINDING, runner_session_id="s-async-wait", wait_seconds=2)
            assert empty.empty and empty.empty_reason == "wait_elapsed" and time.monotonic() - t0 >= 2
            with pytest.raises(sandboxwich.ImageNotAllowedError):
                await c.claim(server.release, **BINDING, runner_session_id="s-async-wait", image="127.0.0.1:5000/python:latest")
            # A claim that waits while the cell it gets comes.
            task = asyncio.create_task(c.claim(server.release, **BINDING, runner_session_id="s-async-wait", wait_seconds=120))
            await asyncio.sleep(2)
            assert not task.done()
            await asyncio.to_thread(release_one, server, held[0])
            cl = await asyncio.wait_for(task, 150)
            assert cl.lease is not None and cl.empty_reason is None
            assert (await c.exec(cl.proof(), ["echo", "async"], timeout=10)).stdout == b"async\n"
            return cl

    cl = asyncio.run(main())
    _end(server, cl)


def test_a_claim_of_the_pools_image(image_server: Server, python_image: str) -> None:
    """A pool that runs an image (dev --image) serves claims of that image;
    a claim of another image of the release is image_not_allowed."""
    with image_server.client() as c:
        cl = c.claim(image_server.release, **BINDING, runner_session_id="s-pool-image", image=python_image, wait_seconds=120)
        assert cl.lease is not None
        assert c.evidence(cl.lease.lease_id).image_digest == python_image.split("@", 1)[1]
        assert c.exec(cl.proof(), ["python3", "-c", "print(6 * 7)"]).stdout == b"42\n"
        other = python_image.split("@", 1)[0] + "@" + DIGEST
        with pytest.raises(sandboxwich.ImageNotAllowedError):
            c.claim(image_server.release, **BINDING, runner_session_id="s-pool-image", image=other, claim_id=uuid.uuid4())
        release_and_wait(c, cl)
