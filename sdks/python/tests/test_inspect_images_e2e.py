"""The Inspect provider's claims that wait and per-sample images against the
real server: sample_init waits at the server for the cell that comes (one
claim, not a poll loop); a compose file naming an image no pool serves
fails the sample in one line; ``inspect eval`` of samples whose compose
files name the image of a fixed pool (dev --image) runs them in cells of
that image; and samples naming different images through compose files run
on an image class (dev --images; skipped on a server without one)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

import sandboxwich
from conftest import Server, release_one
from proxy import Proxy
from sandboxwich import Client

inspect_ai = pytest.importorskip("inspect_ai")

from sandboxwich.inspect import SandboxwichConfig, SandboxwichSandboxEnvironment  # noqa: E402

INSPECT = Path(sys.executable).parent / "inspect"
DIGEST = "sha256:" + "d" * 64


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("SANDBOXWICH_INSPECT_STATE_DIR", str(d))
    return d


def test_sample_init_waits_at_the_server_for_the_cell_that_comes(server: Server, held: list[sandboxwich.Claim], state_dir: Path) -> None:
    with Proxy(server.url, lambda m, p, n: None) as px:
        cfg = SandboxwichConfig(url=px.url, token_file=str(server.dir / "tenant-token"), release=server.release, claim_timeout=90)

        async def main() -> dict[str, Any]:
            await SandboxwichSandboxEnvironment.task_init("waits", cfg)
            t0 = time.monotonic()
            init = asyncio.create_task(SandboxwichSandboxEnvironment.sample_init("waits", cfg, {}))
            await asyncio.sleep(3)
            assert not init.done()  # no ready cell: the sample waits
            await asyncio.to_thread(release_one, server, held[0])
            envs = await asyncio.wait_for(init, 150)
            env = envs["default"]
            assert isinstance(env, SandboxwichSandboxEnvironment)
            assert time.monotonic() - t0 >= 3
            assert (await env.exec(["echo", "came"])).stdout == "came\n"
            md = dict(env.metadata)
            await SandboxwichSandboxEnvironment.sample_cleanup("waits", cfg, envs, False)
            await SandboxwichSandboxEnvironment.task_cleanup("waits", cfg, True)
            return md

        md = asyncio.run(main())
        claims = [json.loads(b) for m, p, b in px.forwarded if p == "/v1/sterile-cells/claim"]
    assert len(claims) == 1, claims  # one claim that waited, not a poll loop
    assert claims[0]["claim_id"] == md["claim_id"] and 85 <= claims[0]["wait_seconds"] <= 90
    assert "image" not in claims[0] and "image" not in md


def test_a_compose_image_no_pool_serves_fails_the_sample_in_one_line(server: Server, tmp_path: Path, state_dir: Path) -> None:
    compose = tmp_path / "compose.yaml"
    compose.write_text(
        "services:\n  default:\n    image: 127.0.0.1:5000/swe/task@" + DIGEST + "\n    network_mode: none\n"
        "x-sandboxwich:\n"
        f"  url: {server.url}\n  token_file: {server.dir / 'tenant-token'}\n  release: {server.release.model_dump_json()}\n"
    )

    async def main() -> None:
        await SandboxwichSandboxEnvironment.task_init("no-pool", str(compose))
        with pytest.raises(RuntimeError) as ei:
            await SandboxwichSandboxEnvironment.sample_init("no-pool", str(compose), {})
        msg = str(ei.value)
        assert msg.startswith(f"sandboxwich: no pool of release dev-release serves image 127.0.0.1:5000/swe/task@{DIGEST} ("), msg
        assert msg.endswith("a pool must run it, or an image class allow its repository") and "\n" not in msg
        await SandboxwichSandboxEnvironment.task_cleanup("no-pool", str(compose), True)

    asyncio.run(main())


PROBE_TASK = """
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox


@solver
def probe():
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        py = await sandbox().exec(["python3", "-c", "import sys; print(sys.version_info[0])"])
        state.metadata["python"] = py.stdout.strip()
        state.metadata["pwd"] = (await sandbox().exec(["pwd"])).stdout.strip()
        state.metadata["image_release"] = (await sandbox().exec(["cat", "/etc/image-release"])).stdout.strip()
        if MARKER:
            state.metadata["marker"] = (await sandbox().exec(["cat", "/etc/marker"])).stdout.strip()
        return state

    return solve


@scorer(metrics=[accuracy()])
def ran():
    async def score(state: TaskState, target: Target) -> Score:
        ok = state.metadata.get("python") == "3" and state.metadata.get("image_release") == "busybox test image"
        return Score(value=CORRECT if ok else INCORRECT, explanation=repr(state.metadata))

    return score


@task
def images():
    return Task(
        dataset=[SAMPLES],
        solver=[probe()],
        scorer=ran(),
        sandbox=TASK_SANDBOX,
    )
"""


def _task(d: Path, samples: list[tuple[str, str | None]], task_sandbox: str | None, marker: bool = False) -> Path:
    """A task file in d: a sample per (id, its compose file or None); with
    marker, the probe also reads the image's /etc/marker."""
    items = ", ".join(f"Sample(input={sid!r}, id={sid!r}" + (f", sandbox=('sandboxwich', {c!r}))" if c else ")") for sid, c in samples)
    text = PROBE_TASK.replace("[SAMPLES]", f"[{items}]").replace("TASK_SANDBOX", repr(("sandboxwich", task_sandbox)) if task_sandbox else "None")
    text = text.replace("if MARKER:", f"if {marker}:")
    p = d / "images_task.py"
    p.write_text(text)
    return p


def _compose(path: Path, image: str, extra: str = "", top: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"services:\n  default:\n    image: {image}\n{extra}{top}")


def _x_sandboxwich(srv: Server, token_file: str) -> str:
    return f"x-sandboxwich:\n  url: {srv.url}\n  token_file: {token_file}\n  release: {srv.release.model_dump_json()}\n"


def _eval(task: Path, cwd: Path, env: dict[str, str], *args: str) -> Any:
    log_dir = cwd / "logs"
    out = subprocess.run(
        [str(INSPECT), "eval", f"{task}@images", "--model", "mockllm/model", "--log-dir", str(log_dir), "--display", "plain", *args],
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    from inspect_ai.log import read_eval_log

    logs = sorted(log_dir.glob("*.eval"))
    assert len(logs) == 1, logs
    with zipfile.ZipFile(logs[0]) as z:
        raw = "".join(z.read(n).decode(errors="replace") for n in z.namelist())
    assert "swla1_" not in raw and "swla1_" not in out.stdout + out.stderr
    log = read_eval_log(str(logs[0]))
    assert log.status == "success", log.error
    assert log.results is not None and log.results.scores[0].metrics["accuracy"].value == 1.0
    assert log.samples is not None
    return log


def test_inspect_eval_of_compose_files_naming_a_pools_image(image_server: Server, python_image: str, tmp_path: Path, state_dir: Path) -> None:
    """Sample a names a/compose.yaml (relative, as a Sample built in code
    passes it: from the working directory) with its own x-sandboxwich and a
    working_dir; sample b takes the task's b/docker-compose.yml, which has
    none and takes url, token and release from the environment. Both run in
    cells of the image they name, the fixed pool's (dev --image)."""
    d = tmp_path / "task"
    (d / "a").mkdir(parents=True)
    (d / "a" / "tenant-token").write_text((image_server.dir / "tenant-token").read_text())
    _compose(
        d / "a" / "compose.yaml",
        python_image,
        "    network_mode: none\n    init: true\n    command: tail -f /dev/null\n    working_dir: /tmp\n    x-note: ignored\n",
        _x_sandboxwich(image_server, "tenant-token"),  # relative to the compose file
    )
    _compose(d / "b" / "docker-compose.yml", python_image, "    command: [sleep, infinity]\n")
    (d / "release.json").write_text(image_server.release.model_dump_json())
    task = _task(d, [("a", "a/compose.yaml"), ("b", None)], "b/docker-compose.yml")
    env = {
        "SANDBOXWICH_INSPECT_STATE_DIR": str(state_dir),
        "SANDBOXWICH_URL": image_server.url,
        "SANDBOXWICH_TOKEN_FILE": str(image_server.dir / "tenant-token"),
        "SANDBOXWICH_RELEASE_FILE": str(d / "release.json"),
    }
    log = _eval(task, d, env, "--max-samples", "1")
    by_id = {s.id: s for s in log.samples}
    assert sorted(by_id) == ["a", "b"]
    assert by_id["a"].metadata["pwd"] == "/tmp" and by_id["b"].metadata["pwd"] == "/home/cell"
    with image_server.client() as c:
        for s in log.samples:
            md = s.metadata["sandboxwich"]
            assert md["image"] == python_image
            assert md["evidence"]["image_digest"] == python_image.split("@", 1)[1]
            assert md["final_state"] == "destroyed" and md["provider_absent"] is True
            assert c.lease(md["lease_id"]).provider_absent
    assert list(state_dir.glob("*.json")) == []


def test_samples_of_different_images_on_an_image_class(image_class_server: Server, task_images: list[str], tmp_path: Path, state_dir: Path) -> None:
    """Three samples, run at once, name two images (each with its own
    /etc/marker) through their compose files; the image class (dev
    --images, max_cells 2) makes cells of each image on demand for the
    samples' waiting claims. Each sample ran in a cell of the image it
    named: its marker, and the digest on the evidence route."""
    srv = image_class_server
    d = tmp_path / "task"
    top = _x_sandboxwich(srv, str(srv.dir / "tenant-token"))
    _compose(d / "one" / "compose.yaml", task_images[0], "    network_mode: none\n", top)
    _compose(d / "two" / "compose.yaml", task_images[1], "    init: true\n", top)
    task = _task(d, [("a", "one/compose.yaml"), ("b", "two/compose.yaml"), ("c", "one/compose.yaml")], None, marker=True)
    log = _eval(task, d, {"SANDBOXWICH_INSPECT_STATE_DIR": str(state_dir)}, "--max-samples", "3")
    want = {"a": (task_images[0], "task-01"), "b": (task_images[1], "task-02"), "c": (task_images[0], "task-01")}
    with srv.client() as c:
        for s in log.samples:
            image, marker = want[str(s.id)]
            md = s.metadata["sandboxwich"]
            assert md["image"] == image and s.metadata["marker"] == marker, (s.id, md, s.metadata)
            assert md["evidence"]["image_digest"] == image.split("@", 1)[1], s.id
            assert md["provider_absent"] is True and c.lease(md["lease_id"]).provider_absent
    with Client(srv.url, token=srv.token, operator_token=srv.operator_token) as op:
        classes = [p for p in op.pools() if p.images]
        assert [p.name for p in classes] == ["dev-images"] and classes[0].max_cells == 2
