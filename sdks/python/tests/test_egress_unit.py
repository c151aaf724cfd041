"""Units of a claim's egress (CONTRACT §22) that need no server: the body
carries the list ([] for none, absent for the pool's policy), a string is
refused before anything is sent, 422 egress_not_allowed is
EgressNotAllowedError, and the evidence reads egress and egress_digest.
test_client_e2e.py runs a claim's egress against the real server."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import pytest

import sandboxwich
from sandboxwich import AsyncClient, Client, Release

RELEASE = Release(release_set_id="r", runtime_class="gvisor_lower_risk", policy_digest="a" * 64, signature="swrs1_x")
BINDING: dict[str, Any] = {"organization_id": "o", "workspace_id": "w", "thread_id": "t", "runner_session_id": "s"}
EMPTY = {"ok": True, "lease": None, "lease_attestation": None}


def test_the_claim_body_carries_egress_sync_and_async() -> None:
    sent: list[dict[str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        sent.append(json.loads(req.content))
        return httpx.Response(200, json=EMPTY)

    with Client("http://sbw.test", token="t", transport=httpx.MockTransport(handler)) as c:
        c.claim(RELEASE, **BINDING, egress=["pkgs.test", "*.files.test:8443"])
        c.claim(RELEASE, **BINDING, egress=[])
        c.claim(RELEASE, **BINDING)
        with pytest.raises(TypeError):
            c.claim(RELEASE, **BINDING, egress="pkgs.test")
        with pytest.raises(TypeError):
            c.claim(RELEASE, **BINDING, egress=[b"pkgs.test"])  # type: ignore[list-item]

    async def main() -> None:
        async with AsyncClient("http://sbw.test", token="t", transport=httpx.MockTransport(handler)) as ac:
            await ac.claim(RELEASE, **BINDING, egress=("pypi.test:443",))

    asyncio.run(main())
    assert len(sent) == 4  # the refused ones sent nothing
    assert sent[0]["egress"] == ["pkgs.test", "*.files.test:8443"] and sent[1]["egress"] == []
    assert "egress" not in sent[2] and sent[3]["egress"] == ["pypi.test:443"]


def test_egress_not_allowed_is_its_own_error() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"ok": False, "code": "egress_not_allowed", "message": "no pool of this release allows it"})

    with Client("http://sbw.test", token="t", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(sandboxwich.EgressNotAllowedError) as ei:
            c.claim(RELEASE, **BINDING, egress=["evil.test"])
    assert ei.value.status == 422


def test_evidence_reads_egress() -> None:
    lease_id = uuid.uuid4()
    ev = {
        "cell_id": str(uuid.uuid4()),
        "pool": "p",
        "provider": "gvisor",
        "provider_mode": "apply",
        "runtime_class": "gvisor_lower_risk",
        "image_digest": None,
        "agent_digest": None,
        "egress": "pkgs.test:443",
        "egress_digest": "b" * 64,
        "admitted_at": "2026-12-07T00:00:00.000000Z",
        "last_verified_at": "2026-12-07T00:00:00.000000Z",
    }

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"ok": True, "evidence": ev})

    with Client("http://sbw.test", token="t", transport=httpx.MockTransport(handler)) as c:
        got = c.evidence(lease_id)
    assert got.egress == "pkgs.test:443" and got.egress_digest == "b" * 64
