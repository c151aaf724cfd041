"""Units that need no server: the secret, claim IDs, backoff, Retry-After,
the SSE decoder."""

from __future__ import annotations

import copy
import email.utils
import logging
import pickle
import time
import uuid

import pytest

import sandboxwich
from sandboxwich import Attestation, RetryPolicy, uuid7
from sandboxwich._core import SSEDecoder, retry_after, retryable

RAW = "swla1_F0qwlTXnAMyLdjGH0WMymO7DtQAhiAqPu5fMH7SXwSk"


def test_attestation_never_shows(caplog: pytest.LogCaptureFixture) -> None:
    a = Attestation(RAW)
    lease = None
    claim = sandboxwich.Claim(uuid7(), lease, a)
    shown = [repr(a), str(a), f"{a}", f"{a!r}", "%s" % a, repr(claim), str(claim), repr([a]), repr({"k": a})]
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("t").info("attestation %s %r", a, a)
        logging.getLogger("t").info("claim %s", claim)
    shown.append(caplog.text)
    for s in shown:
        assert RAW not in s
    with pytest.raises(TypeError):
        pickle.dumps(a)
    with pytest.raises(TypeError):
        pickle.dumps(claim)
    with pytest.raises(TypeError):
        copy.deepcopy(a)
    assert a.reveal() == RAW and a == Attestation(RAW) and a != Attestation(RAW + "x")


def test_attestation_in_models_is_redacted_but_sent() -> None:
    m = sandboxwich.ClaimResponse.model_validate({"ok": True, "lease": None, "lease_attestation": RAW})
    assert RAW not in repr(m) and RAW not in str(m)
    assert RAW in m.model_dump_json()  # what the wire needs


def test_uuid7() -> None:
    ids = [uuid7() for _ in range(1000)]
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in ids)
    assert len(set(ids)) == 1000
    ms = int.from_bytes(ids[0].bytes[:6], "big")
    assert abs(ms - time.time() * 1000) < 5000


def test_backoff_is_full_jitter_and_capped() -> None:
    p = RetryPolicy(6, 0.05, 2.0)
    for n in range(1, 10):
        cap = min(0.05 * 2 ** (n - 1), 2.0)
        assert all(0 <= p.backoff(n) <= cap for _ in range(200))
    with pytest.raises(ValueError):
        RetryPolicy(0)


def test_retry_after() -> None:
    assert retry_after(None) == 0 and retry_after("") == 0 and retry_after("x") == 0
    assert retry_after("3") == 3 and retry_after("3600") == 60
    now = time.time()
    assert retry_after(email.utils.formatdate(now + 10, usegmt=True), now) in (10, 11)
    assert retry_after(email.utils.formatdate(now - 10, usegmt=True), now) == 0


def test_retryable_statuses() -> None:
    def err(status: int, code: str) -> sandboxwich.APIError:
        return sandboxwich.errors.api_error(status, code, "", None)

    assert retryable(err(500, "internal")) and retryable(err(503, "internal")) and retryable(err(429, "internal"))
    assert retryable(err(409, "sterile_cell_claim_contended"))
    for status, code in [(501, "exec_unsupported"), (500, "auth_not_configured"), (507, "insufficient_storage"), (409, "conflict"), (400, "bad_request")]:
        assert not retryable(err(status, code)), code


def test_every_code_maps_to_its_class() -> None:
    for code, cls in sandboxwich.ERRORS.items():
        e = sandboxwich.errors.api_error(cls.default_status, code, "m", "rid")
        assert type(e) is cls and e.code == code and e.request_id == "rid"
        assert pickle.loads(pickle.dumps(e)).code == code
    assert type(sandboxwich.errors.api_error(418, "from_the_future", "", None)) is sandboxwich.APIError


def test_sse_decoder() -> None:
    d = SSEDecoder("rid")
    evs = [d.feed(line) for line in [": keep-alive", "event: stdout", 'data: {"data_base64":"aGk="}', "", "event: exit"]]
    assert evs[3] == sandboxwich.OutputEvent("stdout", b"hi")
    d.feed('data: {"ok":true,"exit_code":0,"truncated":false,"max_output_bytes":1048576,"duration_ms":1,"timed_out":false,"signal":null,"reason":"exited"}')
    ev = d.feed("")
    assert isinstance(ev, sandboxwich.ExitEvent) and d.done
    d = SSEDecoder("rid")
    d.feed("event: error")
    d.feed('data: {"code":"cell_agent_unverified","message":"gone"}')
    with pytest.raises(sandboxwich.CellAgentUnverifiedError) as ei:
        d.feed("")
    assert ei.value.status == 409 and ei.value.request_id == "rid"
    with pytest.raises(sandboxwich.StreamIncompleteError):
        SSEDecoder(None).end()
