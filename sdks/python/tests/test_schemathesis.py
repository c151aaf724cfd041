"""The OpenAPI document against the real server, with schemathesis.

A bounded, deterministic run (hypothesis derandomized, a fixed number of
examples per operation and generation mode) of every documented operation
against ``sandboxwich dev --provider dry-run``. Each case is checked by
schemathesis: no 5xx, a documented status, content type, headers and body
schema, and above all that the document and the server agree on what is
valid: a request the document calls valid is never refused as malformed
(400 invalid_request, 422), and one it calls invalid is never accepted.

The hook (``before_call``) supplies what a schema cannot generate: the
tokens of the route's principal, a signed release for claims and prepares,
the live lease's ID and proof on the lease routes (a fresh lease whenever
the last one ended), one of the worker's own cells on the worker routes, and
a prepare deadline within the server's 7 days. It overwrites only fields
the case already has (and, in a claim, drops an image string and an egress
list and shortens a valid wait_seconds to at most 1 s: see before_call),
and schemathesis
re-validates a case a hook changed, so a negative case stays negative only
while it still breaks the document.

Bounds: SANDBOXWICH_SCHEMATHESIS_EXAMPLES examples per operation and mode
(default 12), a fixed seed, no shrinking: about a minute.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode, HookContext, Response
from schemathesis.core.result import Ok

from conftest import sign_release

EXAMPLES = int(os.environ.get("SANDBOXWICH_SCHEMATHESIS_EXAMPLES", "12"))

# Statuses a request the document calls valid may still get: the state of
# the world (401 for the wrong principal, 404 unknown, 409 not live, 410
# expired events, 501 no exec on dry-run cells, 413 too large as a whole).
# Never 400 invalid_request or 422: those say the document let through
# what the server refuses as malformed.
POSITIVE_OK = ["2xx", "401", "403", "404", "409", "410", "413", "429", "501", "503"]

CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "positive_data_acceptance",
]

# The release of the worker's own cells.
WORKER_RELEASE = {"release_set_id": "st-worker", "runtime_class": "kata_microvm", "policy_digest": "0" * 64}

ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

BINDING = {"organization_id": "org-st", "workspace_id": "ws-st", "thread_id": "th-st", "runner_session_id": "rs-st"}


@dataclass
class _Lease:
    lease_id: str
    proof: dict[str, Any]
    expires: float


@dataclass
class _Target:
    """The dev server under test and what the hook supplies."""

    url: str
    tenant: str
    operator: str
    worker: str
    worker_id: str
    key: bytes
    release: dict[str, Any]
    http: httpx.Client = field(init=False)
    lease: _Lease | None = None
    # The statuses each operation answered, to show the hook's proofs and
    # releases were good (a lease route that only ever said 404 was never
    # really exercised).
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def auth(self, token: str) -> dict[str, str]:
        return {"Authorization": "Bearer " + token}

    def live_lease(self) -> _Lease:
        """The current lease, or a new one when it ended or ends soon."""
        ls = self.lease
        if ls is not None and ls.expires - time.monotonic() > 30:
            r = self.http.post(f"/v1/sterile-cell-leases/{ls.lease_id}/validate", json=ls.proof, headers=self.auth(self.tenant))
            if r.status_code == 200:
                return ls
        deadline = time.monotonic() + 60
        while True:
            r = self.http.post("/v1/sterile-cells/claim", json={"release": self.release, **BINDING}, headers=self.auth(self.tenant))
            r.raise_for_status()
            body = r.json()
            if body["lease"] is not None:
                break
            if time.monotonic() > deadline:
                raise AssertionError("the dry-run pool never had a ready cell")
            time.sleep(0.1)
        lease = body["lease"]
        proof = {"lease_attestation": body["lease_attestation"], "generation": lease["generation"], **BINDING}
        self.lease = _Lease(lease["lease_id"], proof, time.monotonic() + 100)
        return self.lease

    def release_claimed(self, body: Any) -> None:
        """Release the lease a generated claim took, so the pool (whose
        target counts leased cells) keeps ready ones."""
        lease = body.get("lease") if isinstance(body, dict) else None
        if not lease or body.get("lease_attestation") is None:
            return  # empty, or a replay without the attestation
        proof = {"lease_attestation": body["lease_attestation"], "generation": lease["generation"]}
        proof |= {k: lease[k] for k in BINDING}
        self.http.post(f"/v1/sterile-cell-leases/{lease['lease_id']}/release", json=proof | {"disposition": "destroyed"}, headers=self.auth(self.tenant))

    def worker_cell(self) -> str:
        """A new ready cell of the worker, of a release no claim here asks
        for (so the lease routes get the pool's cells)."""
        body = {
            "cell_id": str(uuid.uuid4()),
            "release": self.signed(WORKER_RELEASE),
            "provider_cell_id": "st/" + uuid.uuid4().hex,
            "expires_at": _ahead(3600),
        }
        r = self.http.post(f"/v1/workers/{self.worker_id}/sterile-cells/prepare", json=body, headers=self.auth(self.worker))
        r.raise_for_status()
        return str(r.json()["cell"]["cell_id"])

    def signed(self, release: Any) -> Any:
        """release with a valid signature, when its fields can carry one."""
        if not isinstance(release, dict):
            return release
        fields = [release.get(k) for k in ("release_set_id", "runtime_class", "policy_digest")]
        if not all(isinstance(f, str) for f in fields):
            return release
        return release | {"signature": sign_release(self.key, *fields)}  # type: ignore[arg-type]


def _ahead(seconds: int) -> str:
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


_TARGET: _Target | None = None


def _overwrite(d: Any, values: dict[str, Any]) -> None:
    """Set each key of values that d already has."""
    if isinstance(d, dict):
        for k, v in values.items():
            if k in d:
                d[k] = v


def before_call(context: HookContext, case: Case[Any], kwargs: dict[str, Any]) -> None:
    """Supply tokens, signed releases, live lease proofs and the worker's
    own cells (see the module's docstring)."""
    t = _TARGET
    if t is None:
        return
    path = case.operation.path
    security = case.operation.definition.raw.get("security")
    headers = case.headers if case.headers is not None else {}
    if path.startswith("/v1/workers/"):
        headers.update(t.auth(t.worker))
    elif security != []:
        headers.update(t.auth(t.tenant))
        if security and all("operatorToken" in s for s in security):
            headers["x-sandboxwich-operator-token"] = t.operator
    params = case.path_parameters if case.path_parameters is not None else {}
    body = case.body
    if "{lease_id}" in path:
        ls = t.live_lease()
        params["lease_id"] = ls.lease_id
        _overwrite(body, ls.proof)
        if isinstance(body, dict) and isinstance(body.get("proof"), dict):  # files/write: the proof part
            _overwrite(body["proof"], ls.proof)
        if isinstance(body, dict) and "proof" in body and "content" in body:
            # The parts' order, which a schema cannot say: proof, then
            # content, then any other (ignored).
            ordered: dict[str, Any] = {"proof": body["proof"], "content": body["content"]}
            case.body = ordered | body
    if "{worker_id}" in path:
        params["worker_id"] = t.worker_id
    if "{cell_id}" in path:
        params["cell_id"] = t.worker_cell()
    if path == "/v1/sterile-cells/claim" and isinstance(body, dict) and "release" in body:
        body["release"] = t.release
        # State, not shape: every image string is schema-valid, but only an
        # image a pool of the release runs or allows is claimable (else 422
        # image_not_allowed, as for a tag), and this dry-run pool runs none;
        # test_claim_wait_e2e.py covers claims of an image.
        if isinstance(body.get("image"), str):
            del body["image"]
        # Likewise an egress list: the schema cannot say which strings are
        # host[:port] entries (else 422 invalid_request), nor which a pool
        # covers (else 422 egress_not_allowed, and this pool allows none);
        # test_client_e2e.py and test_egress_unit.py cover a claim's egress.
        if isinstance(body.get("egress"), list):
            del body["egress"]
        # A valid wait stays valid, but short: a claim that finds no ready
        # cell waits that long (CONTRACT §21).
        wait = body.get("wait_seconds")
        if isinstance(wait, int) and not isinstance(wait, bool) and 0 <= wait <= 300:
            body["wait_seconds"] = min(wait, 1)
    if path.endswith("/prepare") and isinstance(body, dict):
        if "release" in body:
            body["release"] = t.signed(body["release"])
        if "expires_at" in body and isinstance(body["expires_at"], str):
            body["expires_at"] = _ahead(600)
        # A cell ID, and a worker's provider cell ID, are used once.
        if "cell_id" in body and isinstance(body["cell_id"], str):
            body["cell_id"] = str(uuid.uuid4())
        pcid = body.get("provider_cell_id")
        if isinstance(pcid, str) and re.fullmatch(r"[A-Za-z0-9._:/-]{1,200}", pcid):
            body["provider_cell_id"] = pcid + "-" + uuid.uuid4().hex
    if path.endswith(("/exec", "/launch")) and isinstance(body, dict):
        # What OpenAPI 3.0 cannot say: argv[0] must not be empty (no
        # per-position item schema) and env keys match
        # [A-Za-z_][A-Za-z0-9_]* (no propertyNames).
        argv = body.get("argv")
        if isinstance(argv, list) and argv and argv[0] == "":
            argv[0] = "true"
        # More than 1 MiB of output with an Idempotency-Key is 400 (a stored
        # answer keeps at most 1 MiB per stream): a rule across a header and
        # a field.
        mob = body.get("max_output_bytes")
        if isinstance(mob, int) and mob > 1 << 20:
            headers.pop("Idempotency-Key", None)
        env = body.get("env")
        if isinstance(env, dict):
            body["env"] = {(k if ENV_KEY.fullmatch(k) else f"K{i}"): v for i, (k, v) in enumerate(env.items())}
    if path == "/v1/sterile-cell-leases" and case.query:
        # The cursor is opaque: only a next_cursor the server gave is one.
        case.query.pop("cursor", None)
    if path == "/v1/events":
        # Without format=json the answer is an endless event stream; with
        # it, Last-Event-ID (a stream's) is ignored, as documented.
        case.query = (case.query or {}) | {"format": "json"}
        headers.pop("Last-Event-ID", None)
    case.headers = headers
    if params:
        case.path_parameters = params


def after_call(context: HookContext, case: Case[Any], response: Response) -> None:
    if _TARGET is not None:
        _TARGET.statuses[case.operation.label][response.status_code] += 1
        if case.operation.path == "/v1/sterile-cells/claim" and response.status_code == 200:
            _TARGET.release_claimed(response.json())


# Registered for every schemathesis run of the process: they act only while
# a target is set (this module's fixture).
schemathesis.hook(before_call)
schemathesis.hook(after_call)


def _start(binary: Path, d: Path) -> Iterator[_Target]:
    log = open(d / "server.log", "wb")
    proc = subprocess.Popen(
        [str(binary), "dev", "--provider", "dry-run", "--target", "20", "--dir", str(d / "state"), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=log,
        cwd=d,
        start_new_session=True,
    )
    assert proc.stdout is not None
    banner = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "token:" not in banner:
        line = proc.stdout.readline().decode()
        if not line:
            break
        banner += line
    threading.Thread(target=lambda: proc.stdout.read() if proc.stdout else None, daemon=True).start()
    try:
        url = re.search(r"serving (http://\S+)", banner)
        worker = re.search(r"Worker ([0-9a-f-]{36}) token", banner)
        if url is None or worker is None:
            pytest.fail("sandboxwich dev did not start: " + banner + (d / "server.log").read_text(errors="replace"))
        state = d / "state"
        key = (state / "signing.key").read_text().strip().encode()
        digest = hashlib.sha256(b"sandboxwich dev policy").hexdigest()
        release = {
            "release_set_id": "dev-release",
            "runtime_class": "gvisor_lower_risk",
            "policy_digest": digest,
            "signature": sign_release(key, "dev-release", "gvisor_lower_risk", digest),
        }
        yield _Target(
            url=url.group(1),
            tenant=(state / "tenant-token").read_text().strip(),
            operator=(state / "operator-token").read_text().strip(),
            worker=(state / "worker-token").read_text().strip(),
            worker_id=worker.group(1),
            key=key,
            release=release,
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def target(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Target]:
    global _TARGET
    for t in _start(binary, tmp_path_factory.mktemp("schemathesis")):
        _TARGET = t
        try:
            yield t
        finally:
            _TARGET = None
            t.http.close()


def run_schemathesis(t: _Target, document: dict[str, Any] | None = None, only: str = "") -> list[str]:
    """Run every operation of the document (the served one by default), or
    only the one labelled only, in both generation modes; return the
    failures, one line each."""
    config = schemathesis.Config.from_dict(
        {
            "checks": {
                "positive_data_acceptance": {"expected-statuses": POSITIVE_OK},
                # 501 exec_unsupported: dry-run cells have no exec, files or launch.
                "not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "501"]},
            },
            # Unknown parameters are ignored by design, as unknown body fields are.
            "generation": {"with-security-parameters": False, "deterministic": True, "allow-extra-parameters": False},
        }
    )
    if document is None:
        schema = schemathesis.openapi.from_url(t.url + "/v1/openapi.json", config=config)
    else:
        schema = schemathesis.openapi.from_dict(document, config=config)
    schema.config.update(base_url=t.url)
    schema.config.checks.update(included_check_names=CHECKS)
    failures: list[str] = []
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            failures.append(f"the document has an operation schemathesis cannot read: {result.err()}")
            continue
        op = result.ok()
        if only and op.label != only:
            continue
        for mode in list(GenerationMode):  # positive, then negative

            @settings(
                max_examples=EXAMPLES,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case: Case[Any]) -> None:
                case.call_and_validate()

            try:
                run()
            except Unsatisfiable:
                pass  # nothing of the operation can break the document (every input is accepted)
            except BaseException as e:  # one per operation and mode
                if not isinstance(e, Exception) and not hasattr(e, "exceptions"):
                    raise  # not a failure (and not schemathesis' FailureGroup): an interrupt
                text = "\n".join([str(e)] + [str(x) for x in getattr(e, "exceptions", [])])
                lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
                failures.append(f"{op.label} [{mode}]: " + " | ".join(lines[:16]))
    return failures


# Answers that show the hook's releases and proofs were good: each of these
# operations must have answered this status at least once.
EXERCISED = {
    "POST /v1/sterile-cells/claim": 200,
    "POST /v1/sterile-cell-leases/{lease_id}/validate": 200,
    "POST /v1/sterile-cell-leases/{lease_id}/release": 202,
    "POST /v1/sterile-cell-leases/{lease_id}/renew": 200,
    "POST /v1/sterile-cell-leases/{lease_id}/revoke": 202,
    "GET /v1/sterile-cell-leases/{lease_id}/evidence": 200,
    "POST /v1/sterile-cell-leases/{lease_id}/exec": 501,  # past the fence: dry-run cells have no exec
    "POST /v1/sterile-cell-leases/{lease_id}/files/write": 501,
    "POST /v1/workers/{worker_id}/sterile-cells/prepare": 200,
    "GET /v1/workers/{worker_id}/sterile-cells/{cell_id}": 200,
}


def test_document_matches_server(target: _Target) -> None:
    failures = run_schemathesis(target)
    assert not failures, "the OpenAPI document and the server disagree:\n" + "\n".join(failures)
    missing = {op: status for op, status in EXERCISED.items() if target.statuses[op][status] == 0}
    assert not missing, f"never answered (the hook's releases or proofs did not work): {missing}; seen {dict(target.statuses)}"


def test_catches_a_disagreement(target: _Target) -> None:
    """The run fails when the document and the server disagree: here a
    document whose exec cwd lost its pattern (^/), so that it calls a
    relative cwd valid, which the server refuses (422)."""
    doc = httpx.get(target.url + "/v1/openapi.json").json()
    cwd = doc["components"]["schemas"]["ExecRequest"]["properties"]["cwd"]
    assert cwd.pop("pattern").startswith("^/")
    failures = run_schemathesis(target, doc, only="POST /v1/sterile-cell-leases/{lease_id}/exec")
    assert failures, "schemathesis did not notice that the document allows a relative cwd"
    assert any("cwd must be an absolute path" in f for f in failures), failures
