"""Units of claims that wait and claims of an image (CONTRACT §21) that need
no server: the claim's body and read timeout, its retries (same claim_id,
same bytes), empty_reason, image_not_allowed. test_claim_wait_e2e.py runs them
against the real server."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

import sandboxwich
from sandboxwich import AsyncClient, Client, Release

RELEASE = Release(release_set_id="r", runtime_class="gvisor_lower_risk", policy_digest="a" * 64, signature="swrs1_x")
DIGEST = "sha256:" + "c" * 64
IMAGE = "registry.test/swe/task-1@" + DIGEST
RAW = "swla1_F0qwlTXnAMyLdjGH0WMymO7DtQAhiAqPu5fMH7SXwSk"
SECRET = "sbw_tenant_secret_value_0123456789"
BINDING: dict[str, Any] = {"organization_id": "o", "workspace_id": "w", "thread_id": "t", "runner_session_id": "s"}


def _lease() -> dict[str, Any]:
    return {
        "lease_id": str(uuid.uuid4()),
        "cell_id": str(uuid.uuid4()),
        "generation": 2,
        "release": RELEASE.model_dump(),
        **BINDING,
        "expires_at": (datetime.now(timezone.utc) + timedelta(seconds=300)).isoformat(),
    }


class Claims:
    """An httpx handler answering claims: the scripted answers in order
    (a status int answers that status), then the last one again. It records
    each request and the read timeout it was sent with."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers) or [{"ok": True, "lease": None, "lease_attestation": None}]
        self.requests: list[httpx.Request] = []
        self.timeouts: list[float | None] = []

    def __call__(self, req: httpx.Request) -> httpx.Response:
        self.requests.append(req)
        self.timeouts.append(req.extensions["timeout"]["read"])
        a = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(a, int):
            return httpx.Response(a, json={"ok": False, "code": "internal", "message": "injected"})
        return httpx.Response(200, json=a)

    def body(self, i: int = -1) -> dict[str, Any]:
        return json.loads(self.requests[i].content)  # type: ignore[no-any-return]


def _nosleep(_: float) -> None:
    return None


async def _anosleep(_: float) -> None:
    return None


# The SDK's claim.


def test_claim_sends_image_and_wait_seconds_and_reads_empty_reason() -> None:
    h = Claims({"ok": True, "lease": None, "lease_attestation": None, "empty_reason": "wait_elapsed"})
    with Client("http://sbw.test", token="t", transport=httpx.MockTransport(h)) as c:
        cl = c.claim(RELEASE, **BINDING, image=IMAGE, wait_seconds=45)
        assert cl.empty and cl.empty_reason == "wait_elapsed" and cl.lease is None
        c.claim(RELEASE, **BINDING)
        c.claim(RELEASE, **BINDING, wait_seconds=0)
    body = h.body(0)
    assert body["image"] == IMAGE and body["wait_seconds"] == 45 and body["claim_id"] == str(cl.claim_id)
    assert "image" not in h.body(1) and "wait_seconds" not in h.body(1)  # a Part I claim is unchanged
    assert h.body(2)["wait_seconds"] == 0


def test_a_leased_claim_has_no_empty_reason() -> None:
    h = Claims({"ok": True, "lease": _lease(), "lease_attestation": RAW})
    with Client("http://sbw.test", token="t", transport=httpx.MockTransport(h)) as c:
        cl = c.claim(RELEASE, **BINDING, wait_seconds=10)
    assert not cl.empty and cl.empty_reason is None and cl.attestation is not None


def test_the_read_timeout_of_a_waiting_claim_outlasts_the_wait_sync_and_async() -> None:
    h = Claims()
    with Client("http://sbw.test", token="t", timeout=20, transport=httpx.MockTransport(h)) as c:
        c.claim(RELEASE, **BINDING, wait_seconds=200)
        c.claim(RELEASE, **BINDING, wait_seconds=5)
        c.claim(RELEASE, **BINDING)
    assert h.timeouts == [230.0, 35.0, 20.0]  # wait + 30 s, at least the client's timeout; others keep it
    h2 = Claims()
    with Client("http://sbw.test", token="t", timeout=60, transport=httpx.MockTransport(h2)) as c:
        c.claim(RELEASE, **BINDING, wait_seconds=5)
    assert h2.timeouts == [60.0]

    ah = Claims()

    async def main() -> None:
        async with AsyncClient("http://sbw.test", token="t", timeout=20, transport=httpx.MockTransport(ah)) as ac:
            await ac.claim(RELEASE, **BINDING, wait_seconds=300)
            await ac.claim(RELEASE, **BINDING)

    asyncio.run(main())
    assert ah.timeouts == [330.0, 20.0]


def test_retries_of_a_waiting_claim_resend_the_same_bytes_and_claim_id_sync_and_async() -> None:
    leased = {"ok": True, "lease": _lease(), "lease_attestation": RAW}
    h = Claims(503, 500, leased)
    with Client("http://sbw.test", token="t", transport=httpx.MockTransport(h), sleep=_nosleep) as c:
        cl = c.claim(RELEASE, **BINDING, image=IMAGE, wait_seconds=60)
    assert not cl.empty and len(h.requests) == 3
    assert h.requests[0].content == h.requests[1].content == h.requests[2].content
    assert h.body()["claim_id"] == str(cl.claim_id) and h.timeouts == [90.0] * 3

    ah = Claims(503, leased)

    async def main() -> sandboxwich.Claim:
        async with AsyncClient("http://sbw.test", token="t", transport=httpx.MockTransport(ah), sleep=_anosleep) as ac:
            return await ac.claim(RELEASE, **BINDING, wait_seconds=60)

    acl = asyncio.run(main())
    assert not acl.empty and ah.requests[0].content == ah.requests[1].content and ah.body()["claim_id"] == str(acl.claim_id)


def test_wait_seconds_is_a_whole_number_and_its_range_is_the_servers() -> None:
    h = Claims()
    with Client("http://sbw.test", token="t", transport=httpx.MockTransport(h)) as c:
        for bad in (True, 1.5, "10"):
            with pytest.raises(TypeError, match="wait_seconds"):
                c.claim(RELEASE, **BINDING, wait_seconds=bad)  # type: ignore[arg-type]
        assert h.requests == []  # nothing was sent
        c.claim(RELEASE, **BINDING, wait_seconds=301)  # the server answers 422 (test_claim_wait_e2e.py)
    assert h.body()["wait_seconds"] == 301


def test_image_not_allowed_is_its_typed_error_with_the_claim_id() -> None:
    def handle(req: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"ok": False, "code": "image_not_allowed", "message": "image must be pinned by digest"})

    cid = sandboxwich.uuid7()
    with Client("http://sbw.test", token="t", transport=httpx.MockTransport(handle)) as c, pytest.raises(sandboxwich.ImageNotAllowedError) as ei:
        c.claim(RELEASE, **BINDING, image="registry.test/swe/task-1:latest", claim_id=cid)
    assert ei.value.status == 422 and ei.value.claim_id == cid  # type: ignore[attr-defined]
