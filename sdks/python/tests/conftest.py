"""Fixtures: the real Go server (``sandboxwich dev``: SQLite, a pool of two
real gVisor cells), built from this repository by the test run.

Without ``go`` or ``runsc`` the server tests skip locally and FAIL under
``CI=true``.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import hmac
import json
import os
import re
import secrets
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
def pyregistry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """internal/testimage/cmd/pyregistry, built."""
    _need("go", shutil.which("go") is not None)
    _need("a static busybox at /bin/busybox (scripts/install-busybox.sh)", Path("/bin/busybox").exists())
    _need("/usr/bin/python3", Path("/usr/bin/python3").exists())
    out = tmp_path_factory.mktemp("bin") / "pyregistry"
    subprocess.run(
        ["go", "build", "-o", str(out), "./internal/testimage/cmd/pyregistry"], cwd=REPO, check=True, env=os.environ | {"GOFLAGS": "-buildvcs=false"}
    )
    return out


def _registry(pyregistry: Path) -> Generator[str, None, None]:
    """Serve pyregistry's image on a loopback port until the generator
    closes: its reference, pinned by digest."""
    proc = subprocess.Popen([str(pyregistry)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    ref = proc.stdout.readline().decode().strip()
    try:
        assert re.fullmatch(r"127\.0\.0\.1:\d+/python@sha256:[0-9a-f]{64}", ref), f"pyregistry printed {ref!r}"
        yield ref
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def python_image(pyregistry: Path) -> Iterator[str]:
    """An image of a static busybox and the host's python3, pushed to a
    registry on loopback (internal/testimage/cmd/pyregistry): its reference,
    pinned by digest. The registry serves until the session ends."""
    yield from _registry(pyregistry)


@pytest.fixture(scope="session")
def python_image_2(pyregistry: Path) -> Iterator[str]:
    """python_image's content from a second registry: another reference
    (another host and port, so another repository) of the same digest."""
    yield from _registry(pyregistry)


@pytest.fixture(scope="session")
def image_server(binary: Path, python_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``sandboxwich dev`` whose one-cell pool runs python_image."""
    yield from _dev(binary, tmp_path_factory.mktemp("dev-image"), "--target", "1", "--image", python_image)


IMAGE_CLASS_UNSUPPORTED = "cannot choose a cell's image"
"""What start-up says when the pool's driver cannot make cells of an image
class (CONTRACT §21)."""


@pytest.fixture(scope="session")
def image_class_server(binary: Path, python_image: str, python_image_2: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``sandboxwich serve`` (SQLite, gVisor) whose one pool is an image
    class allowing the repositories of python_image and python_image_2
    (max_cells 2, warm_idle_seconds 1). ``sandboxwich dev`` has no image
    class, so this is serve with a config file. Skips when the server
    refuses an image class of gVisor cells (a driver without per-cell
    images). serve does not drain at exit: the fixture revokes live leases
    and waits for the pool to empty first, then removes any runsc sandbox
    left in its state root."""
    _need("runsc", shutil.which("runsc") is not None or Path("/usr/local/bin/runsc").exists())
    d = tmp_path_factory.mktemp("serve-images")
    state = d / "state"
    state.mkdir(mode=0o700)
    key = state / "signing.key"
    key.write_text(secrets.token_hex(32) + "\n")
    key.chmod(0o600)
    token, operator = "sbw_dev_" + secrets.token_hex(16), "sbw_op_" + secrets.token_hex(16)
    (state / "tenant-token").write_text(token + "\n")
    (state / "operator-token").write_text(operator + "\n")
    digest = hashlib.sha256(b"sandboxwich image class policy").hexdigest()
    signature = sign_release(key.read_text().strip().encode(), "dev-release", "gvisor_lower_risk", digest)
    rel = Release(release_set_id="dev-release", runtime_class="gvisor_lower_risk", policy_digest=digest, signature=signature)
    runsc_root = state / "runsc-state"
    cfg = {
        "listen": "127.0.0.1:0",
        "database_url": "sqlite://" + str(state / "sandboxwich.db"),
        "sterile_cell_signing_key_file": str(key),
        "default_tenant": "dev",
        "pools": [
            {
                "name": "images",
                "provider": "gvisor",
                "tenant_id": "dev",
                "release": rel.model_dump(),
                "images": [python_image.split("@")[0], python_image_2.split("@")[0]],
                "max_cells": 2,
                "max_cold": 2,
                "warm_idle_seconds": 1,
                "settings": {"state_dir": str(runsc_root), "bundle_dir": str(state / "runsc-bundles"), "image_cache_dir": str(state / "images")},
            }
        ],
    }
    (d / "config.json").write_text(json.dumps(cfg))
    log = d / "server.log"
    logf = open(log, "wb")
    env = os.environ | {"SANDBOXWICH_TENANT_TOKENS": "dev=" + token, "SANDBOXWICH_OPERATOR_TOKEN": operator}
    proc = subprocess.Popen([str(binary), "serve", "--config", str(d / "config.json")], stdout=logf, stderr=logf, cwd=d, start_new_session=True, env=env)
    url = ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not url:
        m = re.search(r'msg="sandboxwich serving" url=(http://\S+)', log.read_text(errors="replace"))
        if m:
            url = m.group(1)
        elif proc.poll() is not None:
            break
        else:
            time.sleep(0.1)
    if not url:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        logf.close()
        _remove_runsc_root(runsc_root)
        text = log.read_text(errors="replace")
        if IMAGE_CLASS_UNSUPPORTED in text:
            pytest.skip("this server has no image class of gVisor cells: " + text.strip().splitlines()[-1][:300])
        pytest.fail("sandboxwich serve did not start: " + text[-3000:])
    srv = Server(url=url, dir=state, binary=binary, token=token, operator_token=operator, release=rel, log=log)
    try:
        with srv.client() as c:
            c.health()
        yield srv
    finally:
        try:
            with Client(url, token=token, operator_token=operator) as c:
                for lz in c.iter_leases(live=True):
                    c.revoke(lz.lease_id)
                end = time.monotonic() + 120
                while time.monotonic() < end:
                    live = c.pools()[0].members
                    if live.provisioning + live.ready + live.leased + live.stopping + live.cleanup_pending == 0:
                        break
                    time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            logf.close()
            _remove_runsc_root(runsc_root)


def _remove_runsc_root(root: Path) -> None:
    """End any runsc sandbox left in root, then unmount the network
    namespace runsc pins there (as gvisor.RemoveStateDir does)."""
    if not root.exists():
        return
    runsc = shutil.which("runsc") or "/usr/local/bin/runsc"
    ids = subprocess.run([runsc, "--root", str(root), "list", "-quiet"], capture_output=True, text=True).stdout.split()
    for cid in ids:
        subprocess.run([runsc, "--root", str(root), "delete", "-force", cid], capture_output=True)
    netns = root / "null-netns"
    libc = ctypes.CDLL(None, use_errno=True)
    while libc.umount2(str(netns).encode(), 2) == 0:  # MNT_DETACH, stacked mounts one by one
        pass


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
