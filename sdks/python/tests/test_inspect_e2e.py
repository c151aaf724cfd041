"""The Inspect provider against the real server: the provider's mappings,
a real ``inspect eval`` with bash_session() and text_editor(), and an
interrupted run cleaned up by ``inspect sandbox cleanup sandboxwich``."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, Server, sign_release, wait_ready
from proxy import Proxy
from sandboxwich import Client, Release

inspect_ai = pytest.importorskip("inspect_ai")

from inspect_ai.util import (  # noqa: E402
    OutputLimitExceededError,
    SandboxUserUnsupportedError,
)

from sandboxwich.inspect import SandboxwichConfig, SandboxwichSandboxEnvironment  # noqa: E402

TASK = REPO / "sdks" / "python" / "examples" / "sterile_task.py"
INSPECT = Path(sys.executable).parent / "inspect"


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("SANDBOXWICH_INSPECT_STATE_DIR", str(d))
    return d


def _config(server: Server, **kw: Any) -> SandboxwichConfig:
    return SandboxwichConfig(url=server.url, token_file=str(server.dir / "tenant-token"), release=server.release, **kw)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_provider_mappings(server: Server, state_dir: Path) -> None:
    cfg = _config(server, exec_output_cap=1000)

    async def main() -> None:
        await SandboxwichSandboxEnvironment.task_init("mapping", cfg)
        envs = await SandboxwichSandboxEnvironment.sample_init("mapping", cfg, {})
        env = envs["default"]
        assert isinstance(env, SandboxwichSandboxEnvironment)
        try:
            r = await env.exec(["pwd"])
            assert (r.success, r.stdout) == (True, "/home/cell\n")
            r = await env.exec(["sh", "-c", "mkdir -p sub && cd sub && pwd"])
            assert r.stdout == "/home/cell/sub\n"
            assert (await env.exec(["pwd"], cwd="sub")).stdout == "/home/cell/sub\n"
            assert (await env.exec(["id", "-u"], user="root")).stdout == "0\n"
            assert (await env.exec(["id", "-un"])).stdout == "cell\n"
            with pytest.raises(SandboxUserUnsupportedError):
                await env.exec(["true"], user="nobody")
            r = await env.exec(["sh", "-c", 'printf %s "$X"; cat; exit 7'], input="in", env={"X": "x"})
            assert (r.returncode, r.stdout, r.success) == (7, "xin", False)
            with pytest.raises(TimeoutError):
                await env.exec(["sleep", "10"], timeout=1)
            with pytest.raises(OutputLimitExceededError):
                await env.exec(["head", "-c", "5000", "/dev/zero"])
            # Input larger than an exec body carries goes through a 0600 file.
            big = os.urandom(3 << 20)
            r = await env.exec(["sha256sum"], input=big)
            assert r.stdout.split()[0] == hashlib.sha256(big).hexdigest()
            assert (await env.exec(["sh", "-c", "ls -a /tmp | grep -c sandboxwich-stdin || true"])).stdout == "0\n"
            # Files: relative paths, parents, text and binary.
            await env.write_file("a/b/c.txt", "line1\r\nline2\n")
            assert await env.read_file("/home/cell/a/b/c.txt") == "line1\r\nline2\n"
            await env.write_file("/tmp/bin", b"\x00\xff")
            assert await env.read_file("/tmp/bin", text=False) == b"\x00\xff"
            with pytest.raises(FileNotFoundError):
                await env.read_file("missing.txt")
            with pytest.raises(IsADirectoryError):
                await env.read_file("a")
            with pytest.raises(PermissionError):
                await env.write_file("/usr/x", "no")
            with pytest.raises(UnicodeDecodeError):
                await env.read_file("/tmp/bin")
        finally:
            await SandboxwichSandboxEnvironment.sample_cleanup("mapping", cfg, envs, False)
        assert env.metadata["final_state"] == "destroyed" and env.metadata["provider_absent"] is True
        assert "attestation" not in json.dumps(env.metadata) and "swla1_" not in json.dumps(env.metadata)
        await SandboxwichSandboxEnvironment.task_cleanup("mapping", cfg, True)
        assert list(state_dir.glob("*.json")) == []

    _run(main())


def test_sample_init_lost_response_leases_once_and_attempts_get_new_cells(server: Server, state_dir: Path) -> None:
    dropped = {"n": 0}

    def fault(method: str, path: str, n: int) -> str | None:
        if path == "/v1/sterile-cells/claim" and dropped["n"] == 0:
            dropped["n"] += 1
            return "drop"
        return None

    with server.client() as c:
        wait_ready(c, 2)
    with Proxy(server.url, fault) as px:
        cfg = SandboxwichConfig(url=px.url, token_file=str(server.dir / "tenant-token"), release=server.release)

        async def main() -> tuple[list[str], str]:
            first = await SandboxwichSandboxEnvironment.sample_init("lost", cfg, {})
            second = await SandboxwichSandboxEnvironment.sample_init("lost", cfg, {})  # a new attempt
            ids = [e.metadata["cell_id"] for e in (first["default"], second["default"])]  # type: ignore[attr-defined]
            session = first["default"].metadata["runner_session_id"]  # type: ignore[attr-defined]
            for envs in (first, second):
                await SandboxwichSandboxEnvironment.sample_cleanup("lost", cfg, envs, False)
            await SandboxwichSandboxEnvironment.task_cleanup("lost", cfg, True)
            return ids, session

        ids, session = _run(main())
    assert dropped["n"] == 1 and ids[0] != ids[1]
    with server.client() as c:
        leases = c.list_leases(runner_session_id=session).leases
        assert sorted(str(lz.cell_id) for lz in leases) == sorted(ids)  # two attempts, two leases, no more
        assert all(lz.state == "destroyed" and lz.provider_absent for lz in leases)


def test_empty_claim_fails_the_sample_after_the_timeout(server: Server, state_dir: Path) -> None:
    key = (server.dir / "signing.key").read_text().strip().encode()
    other = Release(
        release_set_id="no-such-pool",
        runtime_class="gvisor_lower_risk",
        policy_digest="b" * 64,
        signature=sign_release(key, "no-such-pool", "gvisor_lower_risk", "b" * 64),
    )
    cfg = SandboxwichConfig(url=server.url, token_file=str(server.dir / "tenant-token"), release=other, claim_timeout=1.0)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="serves no cells of release no-such-pool"):
            await SandboxwichSandboxEnvironment.task_init("empty", cfg)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="no cell of release no-such-pool within 1 s"):
            await SandboxwichSandboxEnvironment.sample_init("empty", cfg, {})
        assert time.monotonic() - t0 < 10
        await SandboxwichSandboxEnvironment.task_cleanup("empty", cfg, True)

    _run(main())


def _write_config(server: Server, tmp_path: Path) -> Path:
    p = tmp_path / "sandboxwich.json"
    p.write_text(_config(server).model_dump_json())
    return p


def _eval_log_text(log_dir: Path) -> tuple[Path, str]:
    logs = sorted(log_dir.glob("*.eval"))
    assert len(logs) == 1, logs
    text = ""
    with zipfile.ZipFile(logs[0]) as z:
        for name in z.namelist():
            text += z.read(name).decode(errors="replace")
    return logs[0], text


def test_inspect_eval_bash_session_and_text_editor(server: Server, tmp_path: Path, state_dir: Path) -> None:
    cfg = _write_config(server, tmp_path)
    log_dir = tmp_path / "logs"
    env = os.environ | {"SANDBOXWICH_INSPECT_CONFIG": str(cfg), "SANDBOXWICH_INSPECT_STATE_DIR": str(state_dir), "INSPECT_LOG_LEVEL": "info"}
    out = subprocess.run(
        [str(INSPECT), "eval", f"{TASK}@sterile_task", "--log-dir", str(log_dir), "--display", "plain", "--max-samples", "1", "--log-level", "info"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    from inspect_ai.log import read_eval_log

    path, raw = _eval_log_text(log_dir)
    log = read_eval_log(str(path))
    assert log.status == "success"
    assert log.results is not None and log.results.scores[0].metrics["accuracy"].value == 1.0
    assert log.samples is not None and len(log.samples) == 2
    with server.client() as c:
        for s in log.samples:
            md = s.metadata["sandboxwich"]
            assert md["final_state"] == "destroyed" and md["provider_absent"] is True
            assert md["release"]["runtime_class"] == "gvisor_lower_risk"
            assert md["evidence"]["runtime_class"] == "gvisor_lower_risk" and md["evidence"]["agent_digest"]
            st = c.lease(md["lease_id"])
            assert st.state == "destroyed" and st.provider_absent
    # No attestation anywhere: the eval log, Inspect's output, the server's log.
    for where, text in [("eval log", raw), ("inspect stdout", out.stdout), ("inspect stderr", out.stderr), ("server log", server.log_text())]:
        assert "swla1_" not in text, where
    assert list(state_dir.glob("*.json")) == []  # task_cleanup removed the run's record


def test_interrupted_run_then_inspect_sandbox_cleanup(server: Server, tmp_path: Path, state_dir: Path) -> None:
    cfg = _write_config(server, tmp_path)
    env = os.environ | {"SANDBOXWICH_INSPECT_CONFIG": str(cfg), "SANDBOXWICH_INSPECT_STATE_DIR": str(state_dir)}
    proc = subprocess.Popen(
        [str(INSPECT), "eval", f"{TASK}@hang_task", "--log-dir", str(tmp_path / "logs"), "--display", "plain"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=tmp_path,
    )
    with server.client() as c:
        try:
            lease = _wait_live(c, "hang_task", proc)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # a crash: no cleanup runs
            proc.wait()
        assert c.lease(lease).state == "leased"
        records = list(state_dir.glob("*.json"))
        assert len(records) == 1
        # Records that cannot be cleaned, sorted before the run's own: a
        # server that is gone, and a file that is not a record. Each is
        # reported and skipped; the rest are cleaned (issue 40).
        stale = state_dir / "0-stale.json"
        stale.write_text(json.dumps({"url": "http://127.0.0.1:1", "token_file": str(server.dir / "tenant-token"), "runner_session_id": "inspect-stale"}))
        garbage = state_dir / "1-garbage.json"
        garbage.write_text("{")
        out = subprocess.run([str(INSPECT), "sandbox", "cleanup", "sandboxwich"], env=env, capture_output=True, text=True, timeout=300)
        text = out.stdout + out.stderr
        assert out.returncode == 0, text
        assert "revoked 1 orphaned lease" in text, text
        assert "inspect-stale at http://127.0.0.1:1: not cleaned" in text and "1-garbage.json: not a readable run record" in text, text
        st = c.wait_provider_absent(lease, poll=0.2, timeout=90)
        assert st.provider_absent and st.state in ("quarantined", "destroyed")
        assert c.list_leases(workspace_id="hang_task", live=True).leases == []
        assert sorted(state_dir.glob("*.json")) == [stale, garbage]  # kept, reported


def _wait_live(c: Client, workspace: str, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        leases = c.list_leases(workspace_id=workspace, live=True).leases
        if leases:
            # The sample is running its command once the agent is activated.
            time.sleep(3)
            return str(leases[0].lease_id)
        assert proc.poll() is None, "inspect eval exited before claiming"
        time.sleep(0.3)
    raise AssertionError("no live lease appeared")
