"""Benchmarks of the Python SDK and the Inspect provider, as ratios against a
baseline measured in the same run on the same server.

    python bench.py [--samples N]

It builds the Go server, starts ``sandboxwich dev --provider dry-run`` (a
warm pool of simulated cells, so that a claim measures the API, not cell
provisioning), and reports:

- ``claim_ratio``: Python ``Client.claim`` p50 ÷ Go ``client.Claim`` p50
  (target ≤ 2.0), both sequential claims over loopback;
- ``inspect_overhead_ms``: the provider's ``sample_init`` + ``sample_cleanup``
  (no wait for deletion) p50, next to Inspect's ``local`` provider's, in the
  same run (target ≤ 10 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

GO_CLAIM = r"""
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

func main() {
	n, _ := strconv.Atoi(os.Args[3])
	var rel lease.Release
	if err := json.Unmarshal([]byte(os.Args[2]), &rel); err != nil {
		panic(err)
	}
	tok, _ := os.ReadFile(os.Args[4])
	c, err := client.New(os.Args[1], client.WithToken(string(trim(tok))))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	var ds []float64
	for len(ds) < n {
		req := wire.ClaimRequest{Release: rel, Binding: wire.Binding{OrganizationID: "o", WorkspaceID: "w", ThreadID: "t", RunnerSessionID: "bench-go"}}
		t0 := time.Now()
		cl, err := c.Claim(ctx, req)
		d := time.Since(t0)
		if err != nil {
			panic(err)
		}
		if cl.Empty() {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		ds = append(ds, float64(d.Microseconds())/1000)
		if _, err := c.Release(ctx, cl.Lease.LeaseID, cl.Proof(), lease.Destroyed); err != nil {
			panic(err)
		}
	}
	for _, d := range ds {
		fmt.Println(d)
	}
}

func trim(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}
"""


def _release(state: Path) -> dict[str, str]:
    key = (state / "signing.key").read_text().strip().encode()
    digest = hashlib.sha256(b"sandboxwich dev policy").hexdigest()
    msg = b"\0".join([b"sandboxwich-sterile-release-v1", b"dev-release", b"gvisor_lower_risk", digest.encode()])
    sig = "swrs1_" + base64.urlsafe_b64encode(hmac.new(key, msg, hashlib.sha256).digest()).rstrip(b"=").decode()
    return {"release_set_id": "dev-release", "runtime_class": "gvisor_lower_risk", "policy_digest": digest, "signature": sig}


def _go_build(tmp: Path) -> Path:
    d = tmp / "goclaim"
    d.mkdir()
    (d / "main.go").write_text(GO_CLAIM)
    gomod = (REPO / "go.mod").read_text()
    goversion = re.search(r"^go (\S+)", gomod, re.M)
    gover = goversion.group(1) if goversion else "1.24"
    mod = f"module goclaim\n\ngo {gover}\n\nrequire github.com/sandboxwich/sandboxwich v0.0.0\n\n"
    (d / "go.mod").write_text(mod + f"replace github.com/sandboxwich/sandboxwich => {REPO}\n")
    shutil.copy(REPO / "go.sum", d / "go.sum")
    env = os.environ | {"GOFLAGS": "-mod=mod -buildvcs=false"}
    subprocess.run(["go", "build", "-o", str(d / "goclaim"), "."], cwd=d, check=True, env=env, capture_output=True)
    return d / "goclaim"


def _go_claims(prog: Path, url: str, rel: dict[str, str], n: int, token_file: Path) -> list[float]:
    out = subprocess.run([str(prog), url, json.dumps(rel), str(n), str(token_file)], check=True, capture_output=True, text=True)
    return [float(x) for x in out.stdout.split()]


def _py_claims(url: str, rel: dict[str, str], n: int, token_file: Path) -> list[float]:
    from sandboxwich import Client, Release

    release = Release.model_validate(rel)
    ds: list[float] = []
    with Client(url, token_file=token_file) as c:
        while len(ds) < n:
            t0 = time.perf_counter()
            cl = c.claim(release, organization_id="o", workspace_id="w", thread_id="t", runner_session_id="bench-py")
            d = time.perf_counter() - t0
            if cl.empty:
                time.sleep(0.02)
                continue
            ds.append(d * 1000)
            c.release(cl.proof())
    return ds


async def _inspect_overheads(url: str, rel: dict[str, str], n: int, token_file: Path) -> tuple[float, float, dict[str, float]]:
    from inspect_ai.util._sandbox.local import LocalSandboxEnvironment

    from sandboxwich import AsyncClient, Release
    from sandboxwich.inspect import SandboxwichConfig, SandboxwichSandboxEnvironment

    cfg = SandboxwichConfig.model_validate({"url": url, "token_file": str(token_file), "release": rel, "wait_for_deletion": False})
    await SandboxwichSandboxEnvironment.task_init("bench", cfg)
    ours: list[float] = []
    inits: list[float] = []
    cleanups: list[float] = []
    while len(ours) < n:
        t0 = time.perf_counter()
        envs = await SandboxwichSandboxEnvironment.sample_init("bench", cfg, {})
        t1 = time.perf_counter()
        await SandboxwichSandboxEnvironment.sample_cleanup("bench", cfg, envs, False)
        t2 = time.perf_counter()
        ours.append((t2 - t0) * 1000)
        inits.append((t1 - t0) * 1000)
        cleanups.append((t2 - t1) * 1000)
    await SandboxwichSandboxEnvironment.task_cleanup("bench", cfg, True)
    # The SDK's own claim and release, the floor of the provider's two
    # steps, on the same server in the same run.
    release = Release.model_validate(rel)
    claims: list[float] = []
    releases: list[float] = []
    async with AsyncClient(url, token_file=token_file) as c:
        while len(claims) < n:
            t0 = time.perf_counter()
            cl = await c.claim(release, organization_id="o", workspace_id="w", thread_id="t", runner_session_id="bench-sdk")
            t1 = time.perf_counter()
            if cl.empty:
                await asyncio.sleep(0.02)
                continue
            await c.release(cl.proof(), "destroyed")
            claims.append((t1 - t0) * 1000)
            releases.append((time.perf_counter() - t1) * 1000)
    parts = {
        "sample_init_p50_ms": statistics.median(inits),
        "sample_cleanup_p50_ms": statistics.median(cleanups),
        "sdk_claim_p50_ms": statistics.median(claims),
        "sdk_release_p50_ms": statistics.median(releases),
    }
    local: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        envs = await LocalSandboxEnvironment.sample_init("bench", None, {})
        await LocalSandboxEnvironment.sample_cleanup("bench", None, envs, False)
        local.append((time.perf_counter() - t0) * 1000)
    return statistics.median(ours), statistics.median(local), parts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--target", type=int, default=32, help="dry-run pool size")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        binary = tmp / "sandboxwich"
        subprocess.run(["go", "build", "-o", str(binary), "./cmd/sandboxwich"], cwd=REPO, check=True, env=os.environ | {"GOFLAGS": "-buildvcs=false"})
        state = tmp / "dev"
        proc = subprocess.Popen(
            [str(binary), "dev", "--provider", "dry-run", "--dir", str(state), "--listen", "127.0.0.1:0", "--target", str(args.target)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None
            url = ""
            for line in proc.stdout:
                m = re.search(r"serving (http://\S+)", line.decode())
                if m:
                    url = m.group(1)
                    break
            if not url:
                raise SystemExit("sandboxwich dev did not start")
            time.sleep(2)  # the pool fills
            rel = _release(state)
            tok = state / "tenant-token"
            # Warm both up, then measure in alternating rounds, so that both
            # see the same load on this shared machine.
            prog = _go_build(tmp)
            _py_claims(url, rel, 10, tok)
            _go_claims(prog, url, rel, 10, tok)
            gos: list[float] = []
            pys: list[float] = []
            rounds = 5
            for _ in range(rounds):
                gos += _go_claims(prog, url, rel, args.samples // rounds, tok)
                pys += _py_claims(url, rel, args.samples // rounds, tok)
            go, py = statistics.median(gos), statistics.median(pys)
            ours, local, parts = asyncio.run(_inspect_overheads(url, rel, max(20, args.samples // 4), tok))
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    report: dict[str, Any] = {
        "python_claim_p50_ms": round(py, 3),
        "go_claim_p50_ms": round(go, 3),
        "claim_ratio": round(py / go, 3),
        "claim_ratio_target": 2.0,
        "inspect_overhead_p50_ms": round(ours, 3),
        "inspect_overhead_target_ms": 10.0,
        "inspect_local_sample_init_p50_ms": round(local, 3),
        **{k: round(v, 3) for k, v in parts.items()},
        "provider": "dry-run (simulated cells: the API path, not provisioning)",
    }
    print(json.dumps(report, indent=1))
    print(
        f"python bench: claim ratio {report['claim_ratio']} (target <= 2.0), "
        f"inspect overhead p50 {report['inspect_overhead_p50_ms']} ms "
        f"(target <= 10; local {report['inspect_local_sample_init_p50_ms']} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
