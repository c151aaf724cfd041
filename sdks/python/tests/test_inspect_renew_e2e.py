"""The Inspect provider keeps each sample's lease alive (CONTRACT §20),
against a real server whose maximum lease is a few seconds: a sample three
times longer passes; a lease that could not be renewed, or that expired
under a command, fails the sample with an error that says so."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, SHORT_LEASE_SECONDS, Server

inspect_ai = pytest.importorskip("inspect_ai")

from sandboxwich.inspect import SandboxwichConfig, SandboxwichLeaseError, SandboxwichSandboxEnvironment  # noqa: E402

TASK = REPO / "sdks" / "python" / "examples" / "sterile_task.py"
INSPECT = Path(sys.executable).parent / "inspect"


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("SANDBOXWICH_INSPECT_STATE_DIR", str(d))
    return d


def _config(server: Server, **kw: Any) -> SandboxwichConfig:
    return SandboxwichConfig(url=server.url, token_file=str(server.dir / "tenant-token"), release=server.release, **kw)


def test_inspect_eval_sample_three_times_the_maximum_lease(short_server: Server, tmp_path: Path, state_dir: Path) -> None:
    cfg = tmp_path / "sandboxwich.json"
    cfg.write_text(_config(short_server).model_dump_json())
    log_dir = tmp_path / "logs"
    env = os.environ | {"SANDBOXWICH_INSPECT_CONFIG": str(cfg), "SANDBOXWICH_INSPECT_STATE_DIR": str(state_dir)}
    seconds = 3 * SHORT_LEASE_SECONDS
    out = subprocess.run(
        [str(INSPECT), "eval", f"{TASK}@long_task", "-T", f"seconds={seconds}", "--log-dir", str(log_dir), "--display", "plain"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    from inspect_ai.log import read_eval_log

    logs = sorted(log_dir.glob("*.eval"))
    assert len(logs) == 1
    log = read_eval_log(str(logs[0]))
    assert log.status == "success", log.error
    assert log.results is not None and log.results.scores[0].metrics["accuracy"].value == 1.0
    assert log.samples is not None and len(log.samples) == 1
    md = log.samples[0].metadata["sandboxwich"]
    assert md["renewals"] >= 3 and "renewal_error" not in md
    assert md["final_state"] == "destroyed" and md["provider_absent"] is True


def test_a_lease_that_could_not_be_renewed_fails_the_sample(short_server: Server, state_dir: Path) -> None:
    cfg = _config(short_server)

    async def main() -> None:
        await SandboxwichSandboxEnvironment.task_init("renew-fail", cfg)
        envs = await SandboxwichSandboxEnvironment.sample_init("renew-fail", cfg, {})
        env = envs["default"]
        assert isinstance(env, SandboxwichSandboxEnvironment)
        try:
            assert (await env.exec(["true"])).success
            # Ended behind the provider's back (another client): the next
            # renewal is refused, and the sample's next operation fails.
            with short_server.client() as other:
                other.revoke(env.metadata["lease_id"])
            deadline = time.monotonic() + 3 * SHORT_LEASE_SECONDS
            while env._keepalive.error is None and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            with pytest.raises(SandboxwichLeaseError, match="could not be renewed"):
                await env.exec(["true"])
            with pytest.raises(SandboxwichLeaseError, match="could not be renewed"):
                await env.read_file("/etc/hostname")
        finally:
            await SandboxwichSandboxEnvironment.sample_cleanup("renew-fail", cfg, envs, False)
        assert env.metadata["renewal_error"]
        await SandboxwichSandboxEnvironment.task_cleanup("renew-fail", cfg, True)

    asyncio.run(main())


def test_a_command_cut_short_by_lease_expiry_says_the_lease_expired(short_server: Server, state_dir: Path) -> None:
    cfg = _config(short_server)

    async def main() -> None:
        await SandboxwichSandboxEnvironment.task_init("expiry", cfg)
        envs = await SandboxwichSandboxEnvironment.sample_init("expiry", cfg, {})
        env = envs["default"]
        assert isinstance(env, SandboxwichSandboxEnvironment)
        try:
            await env._keepalive.stop()  # no more renewals: the lease runs out under the command
            with pytest.raises(SandboxwichLeaseError, match="expired"):
                await env.exec(["sleep", str(4 * SHORT_LEASE_SECONDS)], timeout=4 * SHORT_LEASE_SECONDS)
        finally:
            await SandboxwichSandboxEnvironment.sample_cleanup("expiry", cfg, envs, False)
        await SandboxwichSandboxEnvironment.task_cleanup("expiry", cfg, True)

    asyncio.run(main())
