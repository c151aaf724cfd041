"""Units of issue 40 that need no server: exec's max_output_bytes (sync and
async, never with an Idempotency-Key above 1 MiB), the provider's
configuration errors (one line, no value quoted), SANDBOXWICH_TOKEN, run
records written only after the server answered, the cleanup that skips
what it cannot clean, and the output-cap message."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

import sandboxwich
from sandboxwich import AsyncClient, Attestation, Client, Release
from sandboxwich._core import Proof

inspect_ai = pytest.importorskip("inspect_ai")

from inspect_ai.util import OutputLimitExceededError  # noqa: E402

from sandboxwich.inspect import (  # noqa: E402
    SandboxwichConfig,
    SandboxwichConfigError,
    SandboxwichSandboxEnvironment,
    _provider,
)

MiB = 1 << 20
RAW = "swla1_F0qwlTXnAMyLdjGH0WMymO7DtQAhiAqPu5fMH7SXwSk"
SECRET = "sbw_tenant_secret_value_0123456789"
RELEASE = Release(release_set_id="r", runtime_class="gvisor_lower_risk", policy_digest="a" * 64, signature="swrs1_x")


def _proof() -> Proof:
    return Proof(uuid.uuid4(), Attestation(RAW), 1, "o", "w", "t", "s")


def _exec_answer(stdout: bytes, stderr: bytes = b"", truncated: bool = False) -> dict[str, Any]:
    return {
        "ok": True,
        "exit_code": 0,
        "stdout_base64": base64.b64encode(stdout).decode(),
        "stderr_base64": base64.b64encode(stderr).decode(),
        "truncated": truncated,
        "max_output_bytes": MiB,
        "duration_ms": 1,
        "timed_out": False,
        "signal": None,
        "reason": "exited",
    }


class Recorder:
    """An httpx transport handler that records requests and answers exec."""

    def __init__(self, out: bytes = b"hi") -> None:
        self.requests: list[httpx.Request] = []
        self.out = out

    def __call__(self, req: httpx.Request) -> httpx.Response:
        self.requests.append(req)
        return httpx.Response(200, json=_exec_answer(self.out))

    def body(self, i: int = -1) -> dict[str, Any]:
        return json.loads(self.requests[i].content)  # type: ignore[no-any-return]


# Exec's max_output_bytes.


def test_exec_sends_max_output_bytes_sync_and_async() -> None:
    rec = Recorder()
    with Client("http://sbw.test", token="t", transport=httpx.MockTransport(rec)) as c:
        c.exec(_proof(), ["true"], max_output_bytes=10 * MiB)
        c.exec(_proof(), ["true"])
        c.exec(_proof(), ["true"], max_output_bytes=MiB, idempotency_key="k1")
    assert rec.body(0)["max_output_bytes"] == 10 * MiB
    assert "max_output_bytes" not in rec.body(1)  # without it the server's default cap applies
    assert rec.body(2)["max_output_bytes"] == MiB and rec.requests[2].headers["idempotency-key"] == "k1"
    assert all("idempotency-key" not in r.headers for r in rec.requests[:2])

    arec = Recorder()

    async def main() -> None:
        async with AsyncClient("http://sbw.test", token="t", transport=httpx.MockTransport(arec)) as ac:
            await ac.exec(_proof(), ["true"], max_output_bytes=10 * MiB)
            await ac.exec(_proof(), ["true"], max_output_bytes=MiB, idempotency_key="k1")

    asyncio.run(main())
    assert arec.body(0)["max_output_bytes"] == 10 * MiB and arec.body(1)["max_output_bytes"] == MiB


def test_exec_never_sends_an_idempotency_key_with_more_than_1_mib() -> None:
    rec = Recorder()
    with Client("http://sbw.test", token="t", transport=httpx.MockTransport(rec)) as c:
        with pytest.raises(ValueError, match="idempotency_key"):
            c.exec(_proof(), ["true"], max_output_bytes=MiB + 1, idempotency_key="k")
        for bad in (0, -1, True, 1.5):
            with pytest.raises(ValueError, match="max_output_bytes"):
                c.exec(_proof(), ["true"], max_output_bytes=bad)  # type: ignore[arg-type]
    arec = Recorder()

    async def main() -> None:
        async with AsyncClient("http://sbw.test", token="t", transport=httpx.MockTransport(arec)) as ac:
            with pytest.raises(ValueError, match="idempotency_key"):
                await ac.exec(_proof(), ["true"], max_output_bytes=10 * MiB, idempotency_key="k")

    asyncio.run(main())
    assert rec.requests == [] and arec.requests == []  # nothing was sent


def test_exec_reads_an_answer_as_large_as_the_cap_asked_for() -> None:
    # 10 MiB of output is 13.3 MiB of base64: more than the 8 MiB bound of
    # other answers.
    big = os.urandom(10 * MiB)
    rec = Recorder(big)
    with Client("http://sbw.test", token="t", transport=httpx.MockTransport(rec)) as c:
        assert c.exec(_proof(), ["x"], max_output_bytes=10 * MiB).stdout == big
        with pytest.raises(sandboxwich.ProtocolError, match="response larger than"):
            c.exec(_proof(), ["x"])  # without the field: the ordinary bound


# The provider's configuration.


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("SANDBOXWICH_INSPECT_STATE_DIR", str(d))
    monkeypatch.delenv("SANDBOXWICH_TOKEN", raising=False)
    monkeypatch.delenv("SANDBOXWICH_TOKEN_FILE", raising=False)
    return d


def _one_line_error(config: Any) -> str:
    with pytest.raises(SandboxwichConfigError) as ei:
        _provider._resolve_config(config)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("sandboxwich: "), msg
    assert "validation error" not in msg and "pydantic" not in msg.lower(), msg
    assert SECRET not in msg
    assert ei.value.__cause__ is None
    assert isinstance(ei.value, ValueError)
    return msg


def _write(p: Path, data: Any) -> str:
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(p)


def test_config_errors_are_one_line(tmp_path: Path, state_dir: Path) -> None:
    good = {"url": "http://127.0.0.1:3217", "token_file": "tok", "release": RELEASE.model_dump()}
    msg = _one_line_error(_write(tmp_path / "a.json", good | {"tokn_file": "x"}))
    assert "unknown key 'tokn_file'" in msg and "token_file" in msg
    msg = _one_line_error(_write(tmp_path / "b.json", good | {"token": SECRET}))
    assert "token_file" in msg and "SANDBOXWICH_TOKEN" in msg
    # A Docker Compose file (by its name, or a services: mapping) names the
    # sample's image, which must be pinned by digest (test_images_unit.py).
    msg = _one_line_error(_write(tmp_path / "compose.yaml", "services:\n  default:\n    image: python:3.12\n"))
    assert "image is a tag without a digest; pin it: image: host/repo@sha256:" in msg
    msg = _one_line_error(_write(tmp_path / "c.yaml", "services:\n  default:\n    image: python:3.12\n"))
    assert "image is a tag without a digest" in msg
    msg = _one_line_error(_write(tmp_path / "d.json", good | {"lease_seconds": "long"}))
    assert "lease_seconds" in msg
    msg = _one_line_error(_write(tmp_path / "e.json", good | {"release": {"release_set_id": SECRET}}))
    assert "release" in msg
    msg = _one_line_error(_write(tmp_path / "f.json", "{not json"))
    assert "not valid JSON" in msg
    msg = _one_line_error(str(tmp_path / "missing.json"))
    assert "missing.json" in msg
    msg = _one_line_error(_write(tmp_path / "g.json", "[1]"))
    assert "mapping" in msg
    # The deserializer Inspect calls on a config dict says the same.
    with pytest.raises(SandboxwichConfigError, match="unknown key 'bogus'"):
        SandboxwichSandboxEnvironment.config_deserialize(good | {"bogus": 1})


def test_relative_token_file_is_relative_to_the_config_file(tmp_path: Path, state_dir: Path) -> None:
    d = tmp_path / "task"
    d.mkdir()
    p = _write(d / "sandboxwich.json", {"token_file": "tenant-token", "release": RELEASE.model_dump()})
    assert _provider._resolve_config(p).token_file == str(d / "tenant-token")


def test_sandboxwich_token_env_is_accepted_and_never_recorded(tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = SandboxwichConfig(url="http://127.0.0.1:1", release=RELEASE)
    with pytest.raises(SandboxwichConfigError, match=r"token_file .* or set SANDBOXWICH_TOKEN"):
        _provider._Session(cfg)
    monkeypatch.setenv("SANDBOXWICH_TOKEN", " " + SECRET + "\n")
    s = _provider._Session(cfg)
    assert s.client._http.headers["authorization"] == "Bearer " + SECRET
    s.write_record()
    text = s.record.read_text()
    assert SECRET not in text and json.loads(text)["token_env"] == "SANDBOXWICH_TOKEN"
    asyncio.run(s.client.aclose())


# Run records and cleanup.


def test_a_failed_task_init_leaves_no_run_record(tmp_path: Path, state_dir: Path) -> None:
    tok = tmp_path / "tok"
    tok.write_text("t")
    cfg = SandboxwichConfig(url="http://127.0.0.1:1", token_file=str(tok), release=RELEASE)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="not usable"):
            await SandboxwichSandboxEnvironment.task_init("t", cfg)
        await SandboxwichSandboxEnvironment.task_cleanup("t", cfg, True)

    asyncio.run(main())
    assert list(state_dir.glob("*.json")) == []


@pytest.fixture
def fake_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """AsyncClient of the provider's cleanup against a fake server at
    http://good.test (one live lease per session, revoked and then absent);
    any other host is unreachable."""
    seen: dict[str, Any] = {"revoked": [], "tokens": []}
    lease = str(uuid.uuid4())

    def handle(req: httpx.Request) -> httpx.Response:
        if req.url.host != "good.test":
            raise httpx.ConnectError("connection refused", request=req)
        seen["tokens"].append(req.headers.get("authorization"))
        if req.url.path == "/v1/sterile-cell-leases":
            return httpx.Response(200, json={"ok": True, "leases": [_summary(lease)], "next_cursor": None})
        st = {
            "lease_id": lease,
            "cell_id": lease,
            "generation": 1,
            "state": "destroyed",
            "disposition": "destroyed",
            "provider_absent": True,
            "cleanup_pending": False,
        }
        if req.url.path.endswith("/revoke"):
            seen["revoked"].append(req.url.path.split("/")[3])
        return httpx.Response(200, json={"ok": True, "status": st})

    real = AsyncClient

    def make(url: str, **kw: Any) -> AsyncClient:
        return real(url, transport=httpx.MockTransport(handle), sleep=_nosleep, **kw)

    monkeypatch.setattr(_provider, "AsyncClient", make)
    yield seen


async def _nosleep(_: float) -> None:
    return None


def _summary(lease: str) -> dict[str, Any]:
    now = datetime.now(timezone.utc)
    return {
        "lease_id": lease,
        "cell_id": lease,
        "generation": 1,
        "state": "leased",
        "disposition": None,
        "provider_absent": False,
        "cleanup_pending": False,
        "organization_id": "o",
        "workspace_id": "w",
        "thread_id": "t",
        "runner_session_id": "s",
        "release_set_id": "r",
        "expires_at": (now + timedelta(seconds=60)).isoformat(),
    }


def test_cli_cleanup_reports_and_skips_what_it_cannot_clean(
    tmp_path: Path, state_dir: Path, fake_server: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir.mkdir(parents=True)
    tok = tmp_path / "tok"
    tok.write_text("good-token\n")
    # Sorted before the good one: a stale record of a server that is gone,
    # one whose token file is gone, one that is not JSON.
    _write(state_dir / "a-stale.json", {"url": "http://gone.test", "token_file": str(tok), "runner_session_id": "inspect-stale"})
    _write(state_dir / "b-notoken.json", {"url": "http://good.test", "token_file": str(tmp_path / "nope"), "runner_session_id": "inspect-nt"})
    _write(state_dir / "c-garbage.json", "{")
    _write(state_dir / "d-good.json", {"url": "http://good.test", "token_file": str(tok), "runner_session_id": "inspect-good"})
    asyncio.run(SandboxwichSandboxEnvironment.cli_cleanup(None))
    out = capsys.readouterr().out
    assert "runner session inspect-good: revoked 1 orphaned lease(s)" in out, out
    assert "inspect-stale at http://gone.test: not cleaned" in out and "inspect-nt" in out and "c-garbage.json" in out, out
    assert "3 record(s) not cleaned" in out
    assert sorted(p.name for p in state_dir.glob("*.json")) == ["a-stale.json", "b-notoken.json", "c-garbage.json"]
    assert len(fake_server["revoked"]) == 1 and set(fake_server["tokens"]) == {"Bearer good-token"}


# The output cap's message.


class _Res:
    def __init__(self, stdout: bytes, truncated: bool, applied: int | None = None) -> None:
        self.stdout, self.stderr, self.truncated = stdout, b"", truncated
        self.timed_out, self.reason, self.exit_code = False, "exited", 0
        self.max_output_bytes = applied


class _FakeClient:
    def __init__(self, res: _Res) -> None:
        self.res = res
        self.kw: dict[str, Any] = {}

    async def exec(self, proof: Any, argv: list[str], **kw: Any) -> _Res:
        self.kw = kw
        return self.res


def _env_with(res: _Res, cap: int | None = None) -> tuple[SandboxwichSandboxEnvironment, _FakeClient]:
    env = SandboxwichSandboxEnvironment.__new__(SandboxwichSandboxEnvironment)
    fake = _FakeClient(res)

    class S:
        config = SandboxwichConfig(url="http://x", token_file="t", release=RELEASE, exec_output_cap=cap)
        client = fake

    env._session = S()  # type: ignore[assignment]
    env._proof = _proof()
    env._remaining = lambda: 60.0  # type: ignore[method-assign]
    env._keepalive = _NoKeepAlive()  # type: ignore[assignment]
    env._expiry = datetime.now(timezone.utc) + timedelta(seconds=60)
    return env, fake


class _NoKeepAlive:
    """The sample's keep-alive, as these tests need it: no failure."""

    error = None
    expires_at = None


def test_provider_asks_for_inspects_limit_and_states_the_cap_that_applied() -> None:
    env, fake = _env_with(_Res(b"x" * (3 * MiB), False))
    r = asyncio.run(env.exec(["x"]))
    assert fake.kw["max_output_bytes"] == 10 * MiB and len(r.stdout) == 3 * MiB
    env, _ = _env_with(_Res(b"x" * (10 * MiB), True))
    with pytest.raises(OutputLimitExceededError, match=r"limit of 10 MiB was exceeded"):
        asyncio.run(env.exec(["x"]))
    # A server that did not honour the field cut at its own 1 MiB: say so.
    env, _ = _env_with(_Res(b"x" * MiB, True))
    with pytest.raises(OutputLimitExceededError, match=r"limit of 1 MiB \(the server's cap; 10 MiB was asked for\)"):
        asyncio.run(env.exec(["x"]))
    # The server says which cap applied: that is the one stated.
    env, _ = _env_with(_Res(b"x" * MiB, True, applied=MiB))
    with pytest.raises(OutputLimitExceededError, match=r"limit of 1 MiB \(the server's cap; 10 MiB was asked for\)"):
        asyncio.run(env.exec(["x"]))
    env, fake = _env_with(_Res(b"x" * 1000, True, applied=1000), cap=1000)
    with pytest.raises(OutputLimitExceededError, match=r"limit of 1000 bytes was exceeded"):
        asyncio.run(env.exec(["x"]))
    assert fake.kw["max_output_bytes"] == 1000
