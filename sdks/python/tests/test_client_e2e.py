"""The SDK against the real server: every tenant route, error mapping,
retries through a faulty loopback proxy, streaming, a 64 MiB round trip."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import stat
import uuid
from pathlib import Path

import httpx
import pytest

import sandboxwich
from conftest import Server, claim, release_and_wait, wait_ready
from proxy import Proxy
from sandboxwich import AsyncClient, Client, ExitEvent, OutputEvent, RetryPolicy
from sandboxwich._core import Req


def test_life_cycle_every_tenant_route(server: Server, tmp_path: Path) -> None:
    with server.client() as c:
        assert c.health().ok
        inv = c.inventory()
        assert [e.release_set_id for e in inv] == ["dev-release"]
        cl = claim(c, server, "s-life")
        assert cl.lease is not None and cl.lease.generation == 2
        assert cl.claim_id.version == 7
        p = cl.proof()
        assert c.validate(p) == cl.lease
        st = c.lease(p.lease_id)
        assert st.state == "leased" and not st.provider_absent
        ev = c.evidence(p.lease_id)
        assert ev.cell_id == cl.lease.cell_id and ev.runtime_class == "gvisor_lower_risk" and ev.agent_digest

        res = c.exec(p, ["sh", "-c", "cat; echo err >&2; exit 3"], stdin=b"in", env={"A": "1"}, cwd="/tmp")
        assert (res.exit_code, res.stdout, res.stderr, res.reason) == (3, b"in", b"err\n", "exited")
        assert c.exec(p, ["id", "-u"], user="root").stdout == b"0\n"
        assert c.exec(p, ["sleep", "5"], timeout=1).timed_out

        events = list(c.exec_stream(p, ["sh", "-c", "echo a; sleep 0.2; echo b >&2; exit 2"]))
        assert [e for e in events if isinstance(e, OutputEvent)] == [OutputEvent("stdout", b"a\n"), OutputEvent("stderr", b"b\n")]
        last = events[-1]
        assert isinstance(last, ExitEvent) and last.exit.exit_code == 2

        # Files: bytes, a path, a file object; download to bytes, a path, a file object.
        assert c.write_file(p, "/home/cell/a/b.txt", b"hello").size == 5
        src = tmp_path / "src"
        src.write_bytes(b"from a path")
        c.write_file(p, "/home/cell/p.txt", src, mode=0o600)
        c.write_file(p, "/home/cell/f.txt", io.BytesIO(b"from a file object"))
        assert c.read_file(p, "/home/cell/a/b.txt") == b"hello"
        dst = tmp_path / "dst"
        assert c.download_file(p, "/home/cell/p.txt", dst) == 11 and dst.read_bytes() == b"from a path"
        buf = io.BytesIO()
        c.download_file(p, "/home/cell/f.txt", buf)
        assert buf.getvalue() == b"from a file object"
        assert c.exec(p, ["stat", "-c", "%a", "/home/cell/p.txt"]).stdout == b"600\n"
        with pytest.raises(TypeError):
            c.write_file(p, "/home/cell/x", "a str is neither content nor a path")  # type: ignore[arg-type]

        la = c.launch(p, ["sh", "-c", "echo resident"])
        assert la.phase in ("accepted", "running", "terminal")
        assert c.launch(p, ["sh", "-c", "echo resident"]).phase in ("accepted", "running", "terminal")  # exact replay
        done = c.wait_launch(p.lease_id, poll=0.1, timeout=30)
        assert done.exit_code == 0
        assert c.read_file(p, "/home/cell/.launch/stdout") == b"resident\n"

        page = c.list_leases(runner_session_id="s-life", live=True)
        assert [lz.lease_id for lz in page.leases] == [p.lease_id]
        assert [lz.lease_id for lz in c.iter_leases(runner_session_id="s-life", limit=1)] == [p.lease_id]

        st = release_and_wait(c, cl)
        assert st.state == "destroyed" and st.disposition == "destroyed" and st.provider_absent
        with pytest.raises(sandboxwich.ConflictError):
            c.validate(p)
        assert c.list_leases(runner_session_id="s-life", live=True).leases == []


def test_revoke_and_pools(server: Server) -> None:
    with server.client() as c:
        cl = claim(c, server, "s-revoke")
        p = cl.proof()
        st = c.revoke(p.lease_id)
        assert st.lease_id == p.lease_id
        st = c.wait_provider_absent(p.lease_id, poll=0.2, timeout=90)
        assert st.state == "quarantined" and st.provider_absent
        with pytest.raises(sandboxwich.ConflictError):
            c.revoke(p.lease_id)
        with pytest.raises(sandboxwich.UnauthorizedError):
            c.pools()
    with Client(server.url, token=server.token, operator_token=server.operator_token) as op:
        pools = op.pools()
        assert [pl.name for pl in pools] == ["dev"] and pools[0].target == 2


def test_events_of_a_revoked_lease(server: Server) -> None:
    """The event log (CONTRACT §16) polled through the SDK: a lease's cell
    went leased, then the lease was revoked, in that order, with strictly
    increasing ids; resuming after the last id yields nothing already seen."""
    with server.client() as c:
        start = c.events(limit=1000)
        after = start.next_after
        for ev in c.iter_events(after=after):
            after = ev.id
        cl = claim(c, server, "s-events")
        p = cl.proof()
        c.revoke(p.lease_id)
        c.wait_provider_absent(p.lease_id, poll=0.2, timeout=90)
        evs = list(c.iter_events(after=after, lease_id=p.lease_id))
        types = [e.type for e in evs]
        assert "cell.leased" in types and "lease.revoked" in types, types
        assert types.index("cell.leased") < types.index("lease.revoked")
        ids = [int(e.id) for e in evs]
        assert ids == sorted(ids) and len(set(ids)) == len(ids) and ids[0] > int(after)
        assert cl.lease is not None and all(e.cell_id == cl.lease.cell_id for e in evs)
        assert list(c.iter_events(after=evs[-1].id, lease_id=p.lease_id)) == []


def test_error_codes_map_to_their_exceptions(server: Server) -> None:
    with Client(server.url, token="not-a-token") as bad, pytest.raises(sandboxwich.UnauthorizedError) as ei:
        bad.inventory()
    assert ei.value.status == 401 and ei.value.request_id
    with server.client() as c:
        forged = server.release.model_copy(update={"signature": "swrs1_" + "A" * 43})
        with pytest.raises(sandboxwich.AuthorizationDeniedError):
            c.claim(forged, organization_id="o", workspace_id="w", thread_id="t", runner_session_id="s")
        with pytest.raises(sandboxwich.BadRequestError):
            c.claim(server.release, organization_id="bad id!", workspace_id="w", thread_id="t", runner_session_id="s")
        with pytest.raises(sandboxwich.InvalidRequestError) as e422:
            c.claim(server.release, organization_id="o", workspace_id="w", thread_id="t", runner_session_id="s", lease_seconds=-1)
        assert e422.value.status == 422
        with pytest.raises(sandboxwich.NotFoundError):
            c.lease(uuid.uuid4())
        with pytest.raises(sandboxwich.MethodNotAllowedError):
            c._json(Req("DELETE", "/sterile-cells/inventory"), sandboxwich.InventoryResponse)
        with pytest.raises(sandboxwich.UnsupportedMediaTypeError):
            c._json(Req("POST", "/sterile-cells/claim", b"{}", content_type="text/plain"), sandboxwich.ClaimResponse)
        with pytest.raises(sandboxwich.PayloadTooLargeError):
            c._json(Req("POST", "/sterile-cells/claim", b'{"x":"' + b"a" * (2 << 20) + b'"}'), sandboxwich.ClaimResponse)

        cl = claim(c, server, "s-errors")
        p = cl.proof()
        wrong = sandboxwich.Proof(
            p.lease_id, sandboxwich.Attestation("swla1_" + "B" * 43), p.generation, p.organization_id, p.workspace_id, p.thread_id, p.runner_session_id
        )
        with pytest.raises(sandboxwich.ConflictError) as ce:
            c.validate(wrong)
        assert "swla1_" not in str(ce.value)
        with pytest.raises(sandboxwich.CellFileNotFoundError):
            c.read_file(p, "/home/cell/missing")
        with pytest.raises(sandboxwich.FileAccessDeniedError):
            c.write_file(p, "/usr/denied", b"x")
        c.write_file(p, "/home/cell/big", b"x" * 100)
        with pytest.raises(sandboxwich.PayloadTooLargeError):
            c.read_file(p, "/home/cell/big", max_bytes=10)
        with pytest.raises(sandboxwich.InvalidRequestError):
            c.exec(p, ["echo", "a\0b"])
        with pytest.raises(sandboxwich.InvalidIdempotencyKeyError):
            c.exec(p, ["true"], idempotency_key="k" * 200)
        assert c.exec(p, ["echo", "once"], idempotency_key="key-1").stdout == b"once\n"
        with pytest.raises(sandboxwich.IdempotencyKeyReusedError):
            c.exec(p, ["echo", "other"], idempotency_key="key-1")
        release_and_wait(c, cl)


def test_lost_claim_response_retry_gets_the_same_lease(server: Server) -> None:
    drops = {"n": 0}

    def fault(method: str, path: str, n: int) -> str | None:
        if path == "/v1/sterile-cells/claim" and drops["n"] == 0:
            drops["n"] += 1
            return "drop"
        return None

    with server.client() as direct:
        wait_ready(direct, 1)
    with Proxy(server.url, fault) as px, Client(px.url, token=server.token, retry=RetryPolicy(6, 0.01, 0.05)) as c:
        cl = c.claim(server.release, organization_id="org-py", workspace_id="ws-py", thread_id="th-py", runner_session_id="s-lost")
        assert cl.lease is not None
        claims = [b for m, path, b in px.forwarded if path == "/v1/sterile-cells/claim"]
        assert len(claims) == 2 and claims[0] == claims[1]  # byte-identical body
        assert json.loads(claims[0])["claim_id"] == str(cl.claim_id)
    with server.client() as direct:
        leases = direct.list_leases(runner_session_id="s-lost").leases
        assert [lz.lease_id for lz in leases] == [cl.lease.lease_id]  # never a second lease
        release_and_wait(direct, cl)


def test_retry_after_is_honoured_and_releases_are_never_retried(server: Server) -> None:
    waits: list[float] = []

    def fault(method: str, path: str, n: int) -> str | None:
        if path == "/v1/sterile-cells/inventory" and n == 1:
            return "503"
        if path.endswith("/release"):
            return "503"
        return None

    with Proxy(server.url, fault) as px, Client(px.url, token=server.token, sleep=waits.append) as c:
        assert c.inventory()
        assert waits == [1.0]
        cl = claim(c, server, "s-retry-after")
        with pytest.raises(sandboxwich.InternalError) as ei:
            c.release(cl.proof())
        assert ei.value.status == 503 and ei.value.retry_after == 1.0
        assert px.counts["/v1/sterile-cell-leases/" + str(cl.proof().lease_id) + "/release"] == 1
    with server.client() as direct:
        release_and_wait(direct, cl)


def test_transport_errors_are_retried_then_reported_with_the_claim_id() -> None:
    waits: list[float] = []
    with Client("http://127.0.0.1:9", token="t", retry=RetryPolicy(3, 0.01, 0.02), sleep=waits.append) as c:
        rel = sandboxwich.Release(release_set_id="r", runtime_class="gvisor_lower_risk", policy_digest="a" * 64, signature="swrs1_x")
        cid = sandboxwich.uuid7()
        with pytest.raises(sandboxwich.TransportError) as ei:
            c.claim(rel, organization_id="o", workspace_id="w", thread_id="t", runner_session_id="s", claim_id=cid)
        assert ei.value.claim_id == cid  # type: ignore[attr-defined]
        assert len(waits) == 2 and all(0 <= w <= 0.02 for w in waits)


def test_64_mib_round_trip(server: Server, tmp_path: Path) -> None:
    src = tmp_path / "big"
    with open(src, "wb") as f:
        for _ in range(64):
            f.write(os.urandom(1 << 20))
    want = hashlib.sha256(src.read_bytes()).hexdigest()
    with server.client() as c:
        cl = claim(c, server, "s-big")
        p = cl.proof()
        w = c.write_file(p, "/home/cell/big.bin", src)
        assert (w.size, w.sha256) == (64 << 20, want)
        dst = tmp_path / "back"
        assert c.download_file(p, "/home/cell/big.bin", dst) == 64 << 20
        assert hashlib.sha256(dst.read_bytes()).hexdigest() == want
        release_and_wait(c, cl)


def test_async_client_and_cancellation(server: Server) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, token=server.token) as c:
            assert (await c.inventory())[0].release_set_id == "dev-release"
            cl = None
            for _ in range(480):
                cl = await c.claim(server.release, organization_id="o", workspace_id="w", thread_id="t", runner_session_id="s-async")
                if not cl.empty:
                    break
                await asyncio.sleep(0.25)
            assert cl is not None and not cl.empty
            p = cl.proof()
            assert (await c.exec(p, ["echo", "hi"])).stdout == b"hi\n"
            evs = [e async for e in c.exec_stream(p, ["sh", "-c", "echo x; exit 4"])]
            assert isinstance(evs[-1], ExitEvent) and evs[-1].exit.exit_code == 4
            await c.write_file(p, "/tmp/a", b"async")
            assert await c.read_file(p, "/tmp/a") == b"async"
            assert (await c.list_leases(runner_session_id="s-async")).leases[0].lease_id == p.lease_id
            assert (await c.validate(p)).lease_id == p.lease_id
            # Cancelling a running command stops the call at once.
            task = asyncio.create_task(c.exec(p, ["sleep", "30"]))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await c.release(p)
            st = await c.wait_provider_absent(p.lease_id, poll=0.2, timeout=90)
            assert st.provider_absent and st.state == "destroyed"

    asyncio.run(main())


def test_attestation_file_is_new_and_0600(server: Server, tmp_path: Path) -> None:
    with server.client() as c:
        cl = claim(c, server, "s-att")
        assert cl.attestation is not None
        f = tmp_path / "lease.att"
        cl.attestation.write_to(f)
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        assert sandboxwich.Attestation.read_from(f) == cl.attestation
        with pytest.raises(FileExistsError):
            cl.attestation.write_to(f)
        raw = cl.attestation.reveal()
        assert raw.startswith("swla1_")
        assert raw not in repr(cl) and raw not in str(cl.proof()) and raw not in repr(cl.lease)
        release_and_wait(c, cl)
        assert raw not in server.log_text()


def test_non_json_error_page_is_typed_by_status() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(413, text="<html>proxy says no</html>", headers={"x-request-id": "r1"})

    with Client("http://sbw.test", token="t", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(sandboxwich.PayloadTooLargeError) as ei:
            c.inventory()
        assert ei.value.request_id == "r1" and "proxy says no" not in str(ei.value)


def test_no_attestation_in_logs_at_debug(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    with caplog.at_level(logging.DEBUG), server.client() as c:
        cl = claim(c, server, "s-logs")
        p = cl.proof()
        logging.getLogger("app").info("claimed %s with %s", cl, p)
        c.validate(p)
        c.exec(p, ["true"])
        list(c.exec_stream(p, ["true"]))
        c.write_file(p, "/tmp/x", b"x")
        c.read_file(p, "/tmp/x")
        release_and_wait(c, cl)
        assert cl.attestation is not None
        raw = cl.attestation.reveal()
    assert caplog.records and raw not in caplog.text


def test_cell_of_a_python_image(image_server: Server, python_image: str) -> None:
    """A pool of an image pinned by digest — a static busybox and the host's
    python3, pulled from a registry on loopback — runs that image: the cell
    has the image's python3 and none of the host's /usr, and the evidence
    names the digest the runtime mounted."""
    with image_server.client() as c:
        cl = claim(c, image_server, "s-image")
        p = cl.proof()
        ev = c.evidence(p.lease_id)
        assert ev.image_digest == python_image.split("@", 1)[1]
        res = c.exec(p, ["python3", "-c", "import json, sys; print(json.dumps([sys.version_info[0], sys.prefix]))"])
        assert (res.exit_code, json.loads(res.stdout)) == (0, [3, "/usr"]), res.stderr
        assert c.exec(p, ["cat", "/etc/image-release"]).stdout == b"busybox test image\n"
        assert c.exec(p, ["sh", "-c", "test -e /usr/bin/apt; echo $?"]).stdout == b"1\n"  # not the host's /usr
        release_and_wait(c, cl)


def test_claim_egress(server: Server) -> None:
    """A claim's egress (CONTRACT §22) against the real server: [] asks for
    none, which every pool covers, and the lease's evidence says so with its
    digest; an entry the pool (egress none) does not allow is
    EgressNotAllowedError, a malformed one InvalidRequestError, a string
    instead of a list a TypeError before anything is sent."""
    with server.client() as c:
        with pytest.raises(sandboxwich.EgressNotAllowedError):
            c.claim(server.release, organization_id="org-py", workspace_id="ws-py", thread_id="th-py", runner_session_id="s-egress", egress=["pkgs.test"])
        with pytest.raises(sandboxwich.InvalidRequestError):
            c.claim(server.release, organization_id="org-py", workspace_id="ws-py", thread_id="th-py", runner_session_id="s-egress", egress=["10.0.0.1"])
        with pytest.raises(TypeError):
            c.claim(server.release, organization_id="org-py", workspace_id="ws-py", thread_id="th-py", runner_session_id="s-egress", egress="pkgs.test")
        assert c.list_leases(runner_session_id="s-egress").leases == []  # the refusals recorded nothing
        cl = claim(c, server, "s-egress", egress=[])
        assert cl.lease is not None
        ev = c.evidence(cl.lease.lease_id)
        assert ev.egress == "none" and ev.egress_digest == hashlib.sha256(b"none").hexdigest()
        assert c.egress(cl.lease.lease_id) == []  # no network, no connections
        release_and_wait(c, cl)
