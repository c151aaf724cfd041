"""Units of the Inspect provider's per-sample images and waiting claims
that need no server: Docker Compose files and the image config key (one
pinned service → the image; every refusal one line naming the fix), and
the claim loop (waits at the server for what is left of claim_timeout,
retries an unknown outcome under the same claim_id and body, takes a new
claim_id after an empty answer, fails naming release and image).
test_inspect_images_e2e.py runs the provider against the real server."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import sandboxwich
from sandboxwich import Release

RELEASE = Release(release_set_id="r", runtime_class="gvisor_lower_risk", policy_digest="a" * 64, signature="swrs1_x")
DIGEST = "sha256:" + "c" * 64
IMAGE = "registry.test/swe/task-1@" + DIGEST
RAW = "swla1_F0qwlTXnAMyLdjGH0WMymO7DtQAhiAqPu5fMH7SXwSk"
SECRET = "sbw_tenant_secret_value_0123456789"


def _lease() -> dict[str, Any]:
    return {
        "lease_id": str(uuid.uuid4()),
        "cell_id": str(uuid.uuid4()),
        "generation": 2,
        "release": RELEASE.model_dump(),
        "organization_id": "o",
        "workspace_id": "w",
        "thread_id": "t",
        "runner_session_id": "s",
        "expires_at": (datetime.now(timezone.utc) + timedelta(seconds=300)).isoformat(),
    }


inspect_ai = pytest.importorskip("inspect_ai")

from sandboxwich.inspect import SandboxwichConfig, SandboxwichConfigError, SandboxwichSandboxEnvironment, _compose, _provider  # noqa: E402


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("SANDBOXWICH_INSPECT_STATE_DIR", str(d))
    for k in ("SANDBOXWICH_TOKEN", "SANDBOXWICH_TOKEN_FILE", "SANDBOXWICH_URL", "SANDBOXWICH_RELEASE_FILE"):
        monkeypatch.delenv(k, raising=False)
    return d


def _compose_file(d: Path, service: str, name: str = "compose.yaml", top: str = "") -> str:
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_text(top + "services:\n  default:\n" + "".join(f"    {line}\n" for line in service.strip().splitlines()))
    return str(p)


def _error(config: Any) -> str:
    """The one-line SandboxwichConfigError of a config."""
    with pytest.raises(SandboxwichConfigError) as ei:
        _provider._resolve_config(config)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("sandboxwich: "), msg
    assert "validation error" not in msg and "pydantic" not in msg.lower() and "Traceback" not in msg, msg
    assert ei.value.__cause__ is None and isinstance(ei.value, ValueError)
    return msg


def test_a_compose_file_with_one_pinned_service_claims_its_image(tmp_path: Path, state_dir: Path) -> None:
    for name in _compose.COMPOSE_FILES:
        p = _compose_file(tmp_path / name, f"image: {IMAGE}\nnetwork_mode: none\ninit: true\ncommand: tail -f /dev/null\nx-default: true", name)
        cfg = _provider._resolve_config(p)
        assert cfg.image == IMAGE and cfg.working_dir == "/home/cell", name
    # A tag beside the digest is the server's to ignore; working_dir is honoured.
    p = _compose_file(tmp_path / "tagged", f"image: registry.test/swe/task-1:v1@{DIGEST}\nworking_dir: /testbed\nentrypoint: [sleep, infinity]")
    cfg = _provider._resolve_config(p)
    assert cfg.image == f"registry.test/swe/task-1:v1@{DIGEST}" and cfg.working_dir == "/testbed"
    # Keep-alive commands, bare or under a shell, are ignored.
    for cmd in ('["tail", "-f", "/dev/null"]', "sleep infinity", "sh -c 'tail -f /dev/null'", '["/bin/sh", "-c", "sleep infinity"]', "exec sleep infinity"):
        p = _compose_file(tmp_path / "cmd", f"image: {IMAGE}\ncommand: {cmd}")
        assert _provider._resolve_config(p).image == IMAGE, cmd


def test_compose_refusals_are_one_line_naming_the_fix(tmp_path: Path, state_dir: Path) -> None:
    d = tmp_path / "c"
    msg = _error(_compose_file(d, "build: .\nimage: " + IMAGE))
    assert msg == (
        f"sandboxwich: config {d}/compose.yaml: service 'default' has build:; cells do not build images:"
        " push the image to a registry and name it by its digest (image: host/repo@sha256:<64 hex>)"
    )
    msg = _error(_compose_file(d, "image: python:3.12"))
    assert msg == f"sandboxwich: config {d}/compose.yaml: service 'default' image is a tag without a digest; pin it: image: host/repo@sha256:<64 hex>"
    assert "python:3.12" not in msg  # no value given is quoted
    msg = _error(_compose_file(d, "image: registry.test/x@sha256:abc"))
    assert msg.endswith("service 'default' image is not pinned by a sha256 digest; pin it: image: host/repo@sha256:<64 hex>")
    msg = _error(_compose_file(d, "image: ${IMAGE}"))
    assert "compose variables are not interpolated" in msg
    msg = _error(_compose_file(d, "working_dir: /w"))
    assert msg.endswith("service 'default' has no image; name one pinned by digest (image: host/repo@sha256:<64 hex>)")
    (d / "two.yaml").write_text(f"services:\n  default:\n    image: {IMAGE}\n  db:\n    image: {IMAGE}\n")
    msg = _error(str(d / "two.yaml"))
    assert msg == f"sandboxwich: config {d}/two.yaml: 2 services ('default', 'db'); a sample runs in one cell of one image: keep exactly one service"
    msg = _error(_compose_file(d, f"image: {IMAGE}\nports: ['8080:80']"))
    assert msg.endswith(
        "service 'default': key 'ports' cannot be honoured by a sterile cell (supported: image (pinned by digest), network_mode: none,"
        " working_dir, init, a keep-alive command or entrypoint, x-* keys); remove it"
    )
    msg = _error(_compose_file(d, f"image: {IMAGE}\nenvironment:\n  TOKEN: {SECRET}"))
    assert "key 'environment' cannot be honoured" in msg and SECRET not in msg
    msg = _error(_compose_file(d, f"image: {IMAGE}\ncommand: python serve.py"))
    assert msg.endswith(
        "service 'default' command: cells do not run the image's command (the cell agent is PID 1 and every command is an exec);"
        " remove it and run it from the task (sandbox().exec)"
    )
    assert "entrypoint" in _error(_compose_file(d, f"image: {IMAGE}\nentrypoint: /start.sh"))
    msg = _error(_compose_file(d, f"image: {IMAGE}", top="volumes:\n  data: {}\n"))
    assert "top-level 'volumes' is not supported" in msg and msg.endswith("remove it")
    msg = _error(_compose_file(d, f"image: {IMAGE}\nx-sandboxwich:\n  claim_timeout: 5"))
    assert "x-sandboxwich belongs at the top level" in msg
    msg = _error(str(_write(d / "empty.yaml", "services: {}\n")))
    assert "no service; give exactly one service" in msg


def test_network_mode_none_is_accepted_and_any_other_network_refused(tmp_path: Path, state_dir: Path) -> None:
    d = tmp_path / "n"
    none = _provider._resolve_config(_compose_file(d, f"image: {IMAGE}\nnetwork_mode: none"))
    assert none.image == IMAGE and none.egress == ()  # asks for no egress (CONTRACT §22)
    absent = _provider._resolve_config(_compose_file(d, f"image: {IMAGE}"))
    assert absent.image == IMAGE and absent.egress is None  # the pool's policy: none unless it has an allow-list
    narrowed = _provider._resolve_config(_compose_file(d, f"image: {IMAGE}", top="x-sandboxwich:\n  egress: [pypi.test]\n"))
    assert narrowed.egress == ("pypi.test",)
    msg = _error(_compose_file(d, f"image: {IMAGE}\nnetwork_mode: none", top="x-sandboxwich:\n  egress: [pypi.test]\n"))
    assert msg.endswith("network_mode: none and x-sandboxwich egress disagree; keep one"), msg
    for mode in ("bridge", "host", "service:db"):
        msg = _error(_compose_file(d, f"image: {IMAGE}\nnetwork_mode: {mode}"))
        assert msg.endswith(
            "service 'default' network_mode: a cell has loopback only, or its pool's egress allow-list;"
            " remove it, or set network_mode: none (x-sandboxwich egress narrows the pool's list)"
        ), msg
        assert mode not in msg
    msg = _error(_compose_file(d, f"image: {IMAGE}\nnetworks: [default]"))
    assert "networks: cells have no network (loopback only)" in msg


def test_memory_and_cpu_limits_are_refused_since_none_can_be_checked(tmp_path: Path, state_dir: Path) -> None:
    d = tmp_path / "m"
    for key in ("mem_limit: 2g", "cpus: 2", "deploy:\n  resources:\n    limits:\n      memory: 1g"):
        msg = _error(_compose_file(d, f"image: {IMAGE}\n{key}"))
        assert "a cell's memory and CPUs are its pool's, and the server shows a tenant no limits to check it against" in msg, msg
        assert msg.endswith("remove it and choose a pool whose cells fit")


def test_a_dockerfile_is_refused(tmp_path: Path, state_dir: Path) -> None:
    for name in ("Dockerfile", "Dockerfile.gpu", "task.Dockerfile"):
        p = _write(tmp_path / name, "FROM python:3.12\n")
        msg = _error(str(p))
        assert msg == (
            f"sandboxwich: config {p} is a Dockerfile; cells do not build images: build it, push it to a registry"
            " and name it by its digest in a compose file (image: host/repo@sha256:<64 hex>)"
        )


def _write(p: Path, text: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_x_sandboxwich_is_validated_like_a_config_file(tmp_path: Path, state_dir: Path) -> None:
    d = tmp_path / "task"
    top = "x-sandboxwich:\n  url: http://127.0.0.1:9\n  token_file: tenant-token\n  claim_timeout: 7\n  release:\n" + "".join(
        f"    {k}: {json.dumps(v)}\n" for k, v in RELEASE.model_dump().items()
    )
    cfg = _provider._resolve_config(_compose_file(d, f"image: {IMAGE}", top=top))
    assert (cfg.url, cfg.token_file, cfg.claim_timeout, cfg.release, cfg.image) == ("http://127.0.0.1:9", str(d / "tenant-token"), 7, RELEASE, IMAGE)
    msg = _error(_compose_file(d, f"image: {IMAGE}", top="x-sandboxwich:\n  tokn_file: x\n"))
    assert msg.startswith(f"sandboxwich: config {d}/compose.yaml x-sandboxwich: unknown key 'tokn_file'")
    msg = _error(_compose_file(d, f"image: {IMAGE}", top=f"x-sandboxwich:\n  token: {SECRET}\n"))
    assert "inline 'token' is not accepted" in msg and SECRET not in msg
    msg = _error(_compose_file(d, f"image: {IMAGE}", top=f"x-sandboxwich:\n  image: {IMAGE}\n"))
    assert "x-sandboxwich must not name an image: the image is the service's" in msg
    msg = _error(_compose_file(d, f"image: {IMAGE}", top="x-sandboxwich:\n  claim_timeout: soon\n"))
    assert "x-sandboxwich: claim_timeout" in msg
    msg = _error(_compose_file(d, f"image: {IMAGE}\nworking_dir: /a", top="x-sandboxwich:\n  working_dir: /b\n"))
    assert "working_dir is given twice" in msg


def test_without_x_sandboxwich_the_rest_comes_from_the_environment(tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rel = _write(tmp_path / "release.json", RELEASE.model_dump_json())
    monkeypatch.setenv("SANDBOXWICH_URL", "http://127.0.0.1:8")
    monkeypatch.setenv("SANDBOXWICH_TOKEN_FILE", "/tmp/tok")
    monkeypatch.setenv("SANDBOXWICH_RELEASE_FILE", str(rel))
    cfg = _provider._resolve_config(_compose_file(tmp_path / "t", f"image: {IMAGE}"))
    assert (cfg.url, cfg.token_file, cfg.release, cfg.image) == ("http://127.0.0.1:8", "/tmp/tok", None, IMAGE)
    assert cfg.resolved_release() == RELEASE


def test_a_relative_compose_path_resolves_from_the_working_directory(tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As Inspect leaves it: a task's and a dataset's relative paths are made
    absolute by Inspect; a Sample built in code passes its path as written."""
    _compose_file(tmp_path / "task", f"image: {IMAGE}")
    monkeypatch.chdir(tmp_path)
    assert _provider._resolve_config("task/compose.yaml").image == IMAGE
    assert "No such file" in _error("elsewhere/compose.yaml")


def test_the_provider_config_image(tmp_path: Path, state_dir: Path) -> None:
    assert SandboxwichConfig(image=IMAGE).image == IMAGE
    p = _write(tmp_path / "sandboxwich.json", json.dumps({"token_file": "t", "release": RELEASE.model_dump(), "image": IMAGE}))
    assert _provider._resolve_config(str(p)).image == IMAGE
    p = _write(tmp_path / "tag.json", json.dumps({"token_file": "t", "image": "registry.test/swe/task-1:latest"}))
    msg = _error(str(p))
    assert msg == f"sandboxwich: config {p}: image is a tag without a digest; pin it: image: host/repo@sha256:<64 hex>"
    with pytest.raises(SandboxwichConfigError, match="image is a tag without a digest"):
        SandboxwichSandboxEnvironment.config_deserialize({"image": "python:3.12"})
    with pytest.raises(ValueError, match="tag without a digest"):
        SandboxwichConfig(image="python:3.12")


def test_inspects_compose_config_object_and_a_compose_dict(state_dir: Path) -> None:
    from inspect_ai.util import ComposeConfig

    cc = ComposeConfig.model_validate({"services": {"default": {"image": IMAGE, "network_mode": "none", "init": True}}})
    assert _provider._resolve_config(cc).image == IMAGE
    cc = ComposeConfig.model_validate({"services": {"default": {"image": IMAGE, "mem_limit": "1g"}}})
    assert "mem_limit" in _error(cc)
    d = SandboxwichSandboxEnvironment.config_deserialize({"services": {"default": {"image": IMAGE}}})
    assert isinstance(d, SandboxwichConfig) and d.image == IMAGE


# The provider's claim loop, against a scripted client.


class FakeClaims:
    """The session's client: scripted claim answers (a Claim, or an
    exception to raise), recording each call's arguments."""

    def __init__(self, *answers: Any, delay: float = 0.0) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []
        self.delay = delay

    async def claim(self, release: Release, **kw: Any) -> sandboxwich.Claim:
        self.calls.append(kw)
        if self.delay:
            await asyncio.sleep(self.delay)
        a = self.answers.pop(0)
        if isinstance(a, BaseException):
            raise a
        return a  # type: ignore[no-any-return]


def _session(fake: FakeClaims, **kw: Any) -> Any:
    class S:
        config = SandboxwichConfig(url="http://x", token_file="t", release=RELEASE, **kw)
        release = RELEASE
        runner_session_id = "inspect-s"
        client = fake

    return S()


def _empty(reason: str | None = "wait_elapsed") -> sandboxwich.Claim:
    return sandboxwich.Claim(sandboxwich.uuid7(), None, None, reason)


def _leased() -> sandboxwich.Claim:
    return sandboxwich.Claim(sandboxwich.uuid7(), sandboxwich.Lease.model_validate(_lease()), sandboxwich.Attestation(RAW))


def test_sample_init_waits_at_the_server_for_what_is_left_of_claim_timeout() -> None:
    fake = FakeClaims(_leased())
    got = asyncio.run(SandboxwichSandboxEnvironment._claim(_session(fake, claim_timeout=120), "w", IMAGE))
    assert not got.empty and len(fake.calls) == 1
    assert fake.calls[0]["wait_seconds"] in (119, 120) and fake.calls[0]["image"] == IMAGE
    fake = FakeClaims(_leased())
    asyncio.run(SandboxwichSandboxEnvironment._claim(_session(fake, claim_timeout=3600), "w"))
    assert fake.calls[0]["wait_seconds"] == 300 and fake.calls[0]["image"] is None  # at most the server's 300 s


def test_an_unknown_outcome_is_retried_under_the_same_claim_id_and_wait() -> None:
    lost = sandboxwich.TransportError("connection reset")
    fake = FakeClaims(lost, sandboxwich.errors.api_error(503, "internal", "x", None), _leased(), delay=0.01)
    asyncio.run(SandboxwichSandboxEnvironment._claim(_session(fake, claim_timeout=60), "w", IMAGE))
    assert len(fake.calls) == 3
    assert len({c["claim_id"] for c in fake.calls}) == 1  # the same fence
    assert len({json.dumps(c, default=str) for c in fake.calls}) == 1  # the same body: it joins the wait


def test_an_empty_answer_takes_a_new_claim_id_while_time_remains() -> None:
    fake = FakeClaims(_empty(), _empty("capacity"), _leased())
    asyncio.run(SandboxwichSandboxEnvironment._claim(_session(fake, claim_timeout=60), "w"))
    assert len({c["claim_id"] for c in fake.calls}) == 3
    assert len({c["thread_id"] for c in fake.calls}) == 1  # one attempt of the sample
    assert all(0 < c["wait_seconds"] <= 60 for c in fake.calls)


def test_the_final_error_names_the_release_and_the_image() -> None:
    fake = FakeClaims(*[_empty() for _ in range(50)])
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as ei:
        asyncio.run(SandboxwichSandboxEnvironment._claim(_session(fake, claim_timeout=0.3), "w", IMAGE))
    assert time.monotonic() - t0 < 5
    assert str(ei.value).startswith(f"sandboxwich: no cell of release r and image {IMAGE} within 0.3 s (claim_timeout; the last claim was empty: wait_elapsed)")
    assert fake.calls[0]["wait_seconds"] is None  # less than a second left: a claim that does not wait
    fake = FakeClaims(*[_empty(None) for _ in range(50)])
    with pytest.raises(RuntimeError, match=r"^sandboxwich: no cell of release r within 0.2 s \(claim_timeout; no ready cell\)$"):
        asyncio.run(SandboxwichSandboxEnvironment._claim(_session(fake, claim_timeout=0.2), "w"))


def test_an_image_no_pool_serves_fails_the_sample_in_one_line() -> None:
    err = sandboxwich.errors.api_error(422, "image_not_allowed", "no pool of the release allows the image", None)
    fake = FakeClaims(err)
    with pytest.raises(RuntimeError) as ei:
        asyncio.run(SandboxwichSandboxEnvironment._claim(_session(fake), "w", IMAGE))
    assert str(ei.value) == (
        f"sandboxwich: no pool of release r serves image {IMAGE} (no pool of the release allows the image):"
        " a pool must run it, or an image class allow its repository"
    )
    assert len(fake.calls) == 1


def test_configs_that_differ_only_in_their_image_share_one_session(tmp_path: Path, state_dir: Path) -> None:
    tok = _write(tmp_path / "tok", "t")
    top = f"x-sandboxwich:\n  token_file: {tok}\n  release: {RELEASE.model_dump_json()}\n"
    a = _compose_file(tmp_path / "a", f"image: {IMAGE}", top=top)
    b = _compose_file(tmp_path / "b", f"image: registry.test/swe/task-2@{DIGEST}", top=top)
    env = SandboxwichSandboxEnvironment
    try:
        sa, ia = env._session_for(a)
        sb, ib = env._session_for(b)
        sc, ic = env._session_for(SandboxwichConfig(token_file=str(tok), release=RELEASE))
        assert sa is sb is sc and (ia, ib, ic) == (IMAGE, f"registry.test/swe/task-2@{DIGEST}", None)
        assert sa.config.image is None
    finally:
        asyncio.run(env.task_cleanup("t", a, False))
        asyncio.run(env.task_cleanup("t", b, False))
    assert _provider._session_key(_provider._resolve_config(a)) not in env._sessions
