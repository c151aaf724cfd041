"""Issue 40 against the real server: exec's max_output_bytes (CONTRACT §25)
through the SDK (sync, async, raw HTTP), and the Inspect provider asking
for Inspect's 10 MiB and recording only what it knows at a release that
does not wait for the deletion."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

import sandboxwich
from conftest import Server, claim, release_and_wait
from sandboxwich import AsyncClient, ExitEvent, OutputEvent

MiB = 1 << 20


def _head(n: int) -> list[str]:
    return ["head", "-c", str(n), "/dev/zero"]


def test_exec_max_output_bytes(server: Server) -> None:
    with server.client() as c:
        assert c.health().checked_at.tzinfo is not None  # CONTRACT §12
        cl = claim(c, server, "s-maxout")
        p = cl.proof()
        try:
            # Without the field the cap stays 1 MiB.
            r = c.exec(p, _head(3 * MiB))
            assert (len(r.stdout), r.truncated) == (MiB, True)
            # Asked for: output between 1 MiB and the cap comes whole.
            assert r.max_output_bytes == MiB  # the cap that applied
            r = c.exec(p, _head(3 * MiB), max_output_bytes=4 * MiB)
            assert (len(r.stdout), r.truncated, r.exit_code, r.max_output_bytes) == (3 * MiB, False, 0, 4 * MiB)
            r = c.exec(p, ["sh", "-c", "head -c 5242880 /dev/zero >&2"], max_output_bytes=4 * MiB)
            assert (len(r.stderr), r.truncated) == (4 * MiB, True)
            # Inspect's 10 MiB: 13.3 MiB of base64 in the answer.
            r = c.exec(p, _head(10 * MiB), max_output_bytes=10 * MiB)
            assert (len(r.stdout), r.truncated) == (10 * MiB, False)
            # Streamed: the same cap.
            events = list(c.exec_stream(p, _head(3 * MiB), max_output_bytes=2 * MiB))
            streamed = sum(len(e.data) for e in events if isinstance(e, OutputEvent))
            last = events[-1]
            assert isinstance(last, ExitEvent) and (streamed, last.exit.truncated, last.exit.max_output_bytes) == (2 * MiB, True, 2 * MiB)
            # Above the ceiling (SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES, 16 MiB): 422.
            with pytest.raises(sandboxwich.InvalidRequestError):
                c.exec(p, ["true"], max_output_bytes=16 * MiB + 1)

            async def main() -> int:
                async with AsyncClient(server.url, token=server.token) as ac:
                    return len((await ac.exec(p, _head(2 * MiB), max_output_bytes=2 * MiB)).stdout)

            assert asyncio.run(main()) == 2 * MiB

            # The SDK never sends an Idempotency-Key with more than 1 MiB; the
            # server refuses it too (its stored answer keeps 1 MiB per stream).
            with pytest.raises(ValueError, match="idempotency_key"):
                c.exec(p, ["true"], max_output_bytes=MiB + 1, idempotency_key="k-big")
            body = p.body() | {"argv": ["true"], "max_output_bytes": 2 * MiB}
            url = f"{server.url}/v1/sterile-cell-leases/{p.lease_id}/exec"
            auth = {"Authorization": "Bearer " + server.token, "Content-Type": "application/json"}
            resp = httpx.post(url, content=json.dumps(body), headers=auth | {"Idempotency-Key": "k-raw"}, timeout=60)
            assert resp.status_code == 400 and resp.json()["code"] == "invalid_idempotency_key", resp.text
            r = c.exec(p, _head(MiB), max_output_bytes=MiB, idempotency_key="k-1mib")
            assert (len(r.stdout), r.truncated) == (MiB, False)
        finally:
            release_and_wait(c, cl)


inspect_ai = pytest.importorskip("inspect_ai")

from inspect_ai.util import OutputLimitExceededError  # noqa: E402

from sandboxwich.inspect import SandboxwichConfig, SandboxwichSandboxEnvironment  # noqa: E402


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("SANDBOXWICH_INSPECT_STATE_DIR", str(d))
    return d


def test_provider_output_up_to_inspects_limit(server: Server, state_dir: Path) -> None:
    cfg = SandboxwichConfig(url=server.url, token_file=str(server.dir / "tenant-token"), release=server.release)

    async def main() -> None:
        await SandboxwichSandboxEnvironment.task_init("maxout", cfg)
        envs = await SandboxwichSandboxEnvironment.sample_init("maxout", cfg, {})
        env = envs["default"]
        assert isinstance(env, SandboxwichSandboxEnvironment)
        try:
            r = await env.exec(["head", "-c", str(3 * MiB), "/dev/zero"])
            assert r.success and len(r.stdout) == 3 * MiB
            with pytest.raises(OutputLimitExceededError, match=r"limit of 10 MiB was exceeded") as ei:
                await env.exec(["head", "-c", str(11 * MiB), "/dev/zero"])
            assert ei.value.truncated_output is not None and len(ei.value.truncated_output) == 10 * MiB
        finally:
            await SandboxwichSandboxEnvironment.sample_cleanup("maxout", cfg, envs, False)
        await SandboxwichSandboxEnvironment.task_cleanup("maxout", cfg, True)

    asyncio.run(main())


def test_release_without_waiting_records_only_what_is_known(server: Server, state_dir: Path) -> None:
    cfg = SandboxwichConfig(url=server.url, token_file=str(server.dir / "tenant-token"), release=server.release, wait_for_deletion=False)

    async def main() -> dict[str, object]:
        await SandboxwichSandboxEnvironment.task_init("nowait", cfg)
        envs = await SandboxwichSandboxEnvironment.sample_init("nowait", cfg, {})
        env = envs["default"]
        assert isinstance(env, SandboxwichSandboxEnvironment)
        assert (await env.exec(["true"])).success
        await SandboxwichSandboxEnvironment.sample_cleanup("nowait", cfg, envs, False)
        await SandboxwichSandboxEnvironment.task_cleanup("nowait", cfg, True)
        return dict(env.metadata)

    md = asyncio.run(main())
    # Not waited for: the release was accepted; nothing claims a state the
    # lease is leaving.
    assert md.get("final_state") != "leased" and md.get("provider_absent") is not False, md
    assert md["release_status"] == "accepted", md
    with server.client() as c:
        st = c.wait_provider_absent(str(md["lease_id"]), poll=0.2, timeout=90)
        assert st.state == "destroyed" and st.provider_absent
