"""Fixtures: the real Go server (``sandboxwich dev``: SQLite, a pool of two
real gVisor cells), built from this repository by the test run.

Without ``go`` or ``runsc`` the server tests skip locally and FAIL under
``CI=true``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import sandboxwich
from sandboxwich import Client, Release

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _need(what: str, ok: bool) -> None:
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required under CI=true")
    pytest.skip(f"{what} not available")


def sign_release(key: bytes, release_set_id: str, runtime_class: str, policy_digest: str) -> str:
    """The swrs1_ signature of a release (CONTRACT §3.2)."""
    msg = b"\0".join([b"sandboxwich-sterile-release-v1", release_set_id.encode(), runtime_class.encode(), policy_digest.encode()])
    mac = hmac.new(key, msg, hashlib.sha256).digest()
    return "swrs1_" + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


@dataclass
class Server:
    url: str
    dir: Path
    binary: Path
    token: str
    operator_token: str
    release: Release
    log: Path

    def client(self, **kw: object) -> Client:
        return Client(self.url, token=self.token, **kw)  # type: ignore[arg-type]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="session")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need("go", shutil.which("go") is not None)
    out = tmp_path_factory.mktemp("bin") / "sandboxwich"
    env = os.environ | {"GOFLAGS": "-buildvcs=false"}
    subprocess.run(["go", "build", "-o", str(out), "./cmd/sandboxwich"], cwd=REPO, check=True, env=env)
    # The cell agent, next to the binary, where the gVisor driver finds it.
    agent = out.parent / "sandboxwich-agent"
    subprocess.run(
        ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(agent), "./cmd/sandboxwich-agent"], cwd=REPO, check=True, env=env | {"CGO_ENABLED": "0"}
    )
    return out


def _dev(binary: Path, d: Path, *args: str, env: dict[str, str] | None = None) -> Generator[Server, None, None]:
    """Run ``sandboxwich dev`` in d with args (and env added to the
    environment) until the generator closes."""
    _need("runsc", shutil.which("runsc") is not None or Path("/usr/local/bin/runsc").exists())
    log = d / "server.log"
    logf = open(log, "wb")
    proc = subprocess.Popen(
        [str(binary), "dev", "--dir", str(d / "state"), "--listen", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE,
        stderr=logf,
        cwd=d,
        start_new_session=True,
        env=os.environ | (env or {}),
    )
    assert proc.stdout is not None
    url = ""
    deadline = time.monotonic() + 120
    banner = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            break
        banner.append(line)
        m = re.search(r"serving (http://\S+)", line)
        if m:
            url = m.group(1)
            break
    if not url:
        proc.kill()
        pytest.fail("sandboxwich dev did not start: " + "".join(banner) + log.read_text(errors="replace"))
    # Keep draining stdout so the server never blocks on a full pipe.
    threading.Thread(target=lambda: proc.stdout.read() if proc.stdout else None, daemon=True).start()
    state = d / "state"
    key = (state / "signing.key").read_text().strip().encode()
    digest = hashlib.sha256(b"sandboxwich dev policy").hexdigest()
    rel = Release(
        release_set_id="dev-release",
        runtime_class="gvisor_lower_risk",
        policy_digest=digest,
        signature=sign_release(key, "dev-release", "gvisor_lower_risk", digest),
    )
    srv = Server(
        url=url,
        dir=state,
        binary=binary,
        token=(state / "tenant-token").read_text().strip(),
        operator_token=(state / "operator-token").read_text().strip(),
        release=rel,
        log=log,
    )
    try:
        with srv.client() as c:
            wait_ready(c, 1)
        yield srv
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        logf.close()


@pytest.fixture(scope="session")
def server(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _dev(binary, tmp_path_factory.mktemp("dev"), "--target", "2")


SHORT_LEASE_SECONDS = 8
"""The maximum lease of short_server: renewals must keep its leases alive."""


@pytest.fixture(scope="session")
def short_server(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``sandboxwich dev`` (one cell) whose maximum lease is
    SHORT_LEASE_SECONDS (SANDBOXWICH_MAX_LEASE_SECONDS): a lease lives past
    it only by renewal (CONTRACT §20)."""
    gen = _dev(binary, tmp_path_factory.mktemp("dev-short"), "--target", "1", env={"SANDBOXWICH_MAX_LEASE_SECONDS": str(SHORT_LEASE_SECONDS)})
    srv = next(gen)
    try:
        with srv.client() as c:
            got = c.inventory()[0].max_lease_seconds
        if got != SHORT_LEASE_SECONDS:
            pytest.fail(f"sandboxwich dev serves a maximum lease of {got} s: it must honour SANDBOXWICH_MAX_LEASE_SECONDS={SHORT_LEASE_SECONDS}")
        yield srv
    finally:
        gen.close()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """A registry on loopback (internal/testimage/cmd/pyregistry -images 2)
    serving an image of a static busybox and the host's python3, then two
    images of it each with its own /etc/marker (swe/task-01 and swe/task-02,
    marked task-01 and task-02): their references, pinned by digest. It
    serves until the session ends."""
    _need("go", shutil.which("go") is not None)
    _need("a static busybox at /bin/busybox (scripts/install-busybox.sh)", Path("/bin/busybox").exists())
    _need("/usr/bin/python3", Path("/usr/bin/python3").exists())
    out = tmp_path_factory.mktemp("bin") / "pyregistry"
    subprocess.run(
        ["go", "build", "-o", str(out), "./internal/testimage/cmd/pyregistry"], cwd=REPO, check=True, env=os.environ | {"GOFLAGS": "-buildvcs=false"}
    )
    proc = subprocess.Popen([str(out), "-images", "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    refs = [proc.stdout.readline().decode().strip() for _ in range(3)]
    try:
        for ref, repo in zip(refs, ["python", "swe/task-01", "swe/task-02"], strict=True):
            assert re.fullmatch(r"127\.0\.0\.1:\d+/" + repo + r"@sha256:[0-9a-f]{64}", ref), f"pyregistry printed {refs!r}"
        yield refs
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def python_image(registry: list[str]) -> str:
    """The registry's image of a static busybox and the host's python3."""
    return registry[0]


@pytest.fixture(scope="session")
def task_images(registry: list[str]) -> list[str]:
    """The registry's two marked images (python_image plus an /etc/marker
    of task-01, task-02), for an image class."""
    return registry[1:]


@pytest.fixture(scope="session")
def image_server(binary: Path, python_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``sandboxwich dev`` whose one-cell pool runs python_image."""
    yield from _dev(binary, tmp_path_factory.mktemp("dev-image"), "--target", "1", "--image", python_image)


@pytest.fixture(scope="session")
def image_class_server(binary: Path, task_images: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``sandboxwich dev`` with, beside its one-cell pool, an image class
    (pool dev-images, CONTRACT §21) allowing the registry's swe/* images,
    at most two live cells. Skips when the server shows no image class of
    the release (a server without one)."""
    host = task_images[0].split("/", 1)[0]
    gen = _dev(binary, tmp_path_factory.mktemp("dev-images"), "--target", "1", "--images", host + "/swe/*", "--max-cells", "2")
    srv = next(gen)
    try:
        with srv.client() as c:
            if not any(e.images for e in c.inventory()):
                pytest.skip("this server has no image class (the inventory shows no images)")
        yield srv
    finally:
        gen.close()


def wait_ready(c: Client, n: int, timeout: float = 120) -> None:
    """Wait until the dev pool has at least n ready cells."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inv = c.inventory()
        if inv and inv[0].ready >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"the pool never had {n} ready cells")


def claim(c: Client, srv: Server, session: str, timeout: float = 120, **kw: object) -> sandboxwich.Claim:
    """Claim a cell, waiting for the pool to replenish."""
    deadline = time.monotonic() + timeout
    while True:
        cl = c.claim(srv.release, organization_id="org-py", workspace_id="ws-py", thread_id="th-py", runner_session_id=session, **kw)  # type: ignore[arg-type]
        if not cl.empty:
            return cl
        if time.monotonic() > deadline:
            raise AssertionError("no cell became ready")
        time.sleep(0.25)


def release_and_wait(c: Client, cl: sandboxwich.Claim) -> sandboxwich.LeaseStatus:
    c.release(cl.proof(), "destroyed")
    return c.wait_provider_absent(cl.proof().lease_id, poll=0.2, timeout=90)


@pytest.fixture
def held(server: Server) -> Iterator[list[sandboxwich.Claim]]:
    """Every cell of the dev pool (target 2) leased: no ready cell, and none
    is made while they live (the pool counts leased cells as live). A test
    releases one (release_one) to let a cell come; the rest are released
    after it, and the pool is whole again for the next test."""
    with server.client() as c:
        wait_ready(c, 2)
        cells = [claim(c, server, "s-held"), claim(c, server, "s-held")]
        assert c.inventory()[0].ready == 0
        yield cells
        for cl in cells:
            assert cl.lease is not None
            st = c.lease(cl.lease.lease_id)
            if st.state == "leased" and st.disposition is None:  # not released by the test
                release_and_wait(c, cl)
        wait_ready(c, 2)


def release_one(server: Server, cl: sandboxwich.Claim) -> None:
    """Release a held cell (its replacement is then made)."""
    with server.client() as c:
        c.release(cl.proof())
