"""The webhook verifier against the Standard Webhooks specification's test
vector (github.com/standard-webhooks/standard-webhooks, the Go library's
tests), as the Go client's test uses it."""

from __future__ import annotations

import pytest

from sandboxwich.webhooks import (
    WebhookSignatureError,
    WebhookTimestampError,
    WebhookVerifier,
)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = 1614265330
PAYLOAD = b'{"test": 2432232314}'
SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
BAD_SIGNATURE = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="


def headers(sig: str, ts: int = TIMESTAMP) -> dict[str, str]:
    return {"Webhook-Id": MSG_ID, "Webhook-Timestamp": str(ts), "Webhook-Signature": sig}


@pytest.mark.parametrize("secret", [SECRET, SECRET.removeprefix("whsec_")])
def test_vector(secret: str) -> None:
    v = WebhookVerifier(secret, now=lambda: float(TIMESTAMP))
    assert v.verify(headers(SIGNATURE), PAYLOAD) == MSG_ID
    # One matching signature among several (a rotation) is enough.
    assert v.verify(headers(f"{BAD_SIGNATURE} v2,xyz {SIGNATURE}"), PAYLOAD) == MSG_ID
    with pytest.raises(WebhookSignatureError):
        v.verify(headers(BAD_SIGNATURE), PAYLOAD)
    with pytest.raises(WebhookSignatureError):
        v.verify(headers(SIGNATURE), PAYLOAD + b" ")
    with pytest.raises(WebhookSignatureError):
        v.verify({"webhook-id": MSG_ID}, PAYLOAD)


def test_timestamp_tolerance() -> None:
    v = WebhookVerifier(SECRET, tolerance=300, now=lambda: float(TIMESTAMP + 301))
    with pytest.raises(WebhookTimestampError):
        v.verify(headers(SIGNATURE), PAYLOAD)
    early = WebhookVerifier(SECRET, tolerance=300, now=lambda: float(TIMESTAMP - 301))
    with pytest.raises(WebhookTimestampError):
        early.verify(headers(SIGNATURE), PAYLOAD)
    with pytest.raises(WebhookTimestampError):
        WebhookVerifier(SECRET, now=lambda: float(TIMESTAMP)).verify(headers(SIGNATURE, ts=0) | {"Webhook-Timestamp": "x"}, PAYLOAD)


def test_rotation_and_bad_secrets() -> None:
    v = WebhookVerifier("whsec_b3RoZXJrZXk=", SECRET, now=lambda: float(TIMESTAMP))
    assert v.verify(headers(SIGNATURE), PAYLOAD) == MSG_ID
    assert "MfKQ" not in repr(v)
    for bad in ["", "whsec_", "whsec_!!!"]:
        with pytest.raises(ValueError):
            WebhookVerifier(bad)
