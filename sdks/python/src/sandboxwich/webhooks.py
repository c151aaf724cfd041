"""Verification of webhook deliveries (CONTRACT §16, Standard Webhooks).

A delivery carries ``webhook-id``, ``webhook-timestamp`` (Unix seconds) and
``webhook-signature``: space-separated ``v1,<base64 HMAC-SHA256(key,
id.timestamp.body)>`` signatures, one per secret the server signs with
(several during a rotation). :class:`WebhookVerifier` checks the timestamp
against a tolerance, then that one signature matches one of its secrets,
and returns the ``webhook-id``: deliveries are at least once, so receivers
dedupe by it. It is the Go client's ``client.WebhookVerifier``, rule for
rule.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping

from .errors import SandboxwichError

__all__ = [
    "DEFAULT_WEBHOOK_TOLERANCE",
    "WEBHOOK_ID_HEADER",
    "WEBHOOK_SIGNATURE_HEADER",
    "WEBHOOK_TIMESTAMP_HEADER",
    "WebhookSignatureError",
    "WebhookTimestampError",
    "WebhookVerificationError",
    "WebhookVerifier",
]

WEBHOOK_ID_HEADER = "webhook-id"
WEBHOOK_TIMESTAMP_HEADER = "webhook-timestamp"
WEBHOOK_SIGNATURE_HEADER = "webhook-signature"

DEFAULT_WEBHOOK_TOLERANCE = 300.0
"""Seconds a delivery's timestamp may be from the receiver's clock, either way."""


class WebhookVerificationError(SandboxwichError):
    """A delivery that is not proven to come from the server."""


class WebhookSignatureError(WebhookVerificationError):
    """No signature of the delivery matches a secret (or headers are missing)."""


class WebhookTimestampError(WebhookVerificationError):
    """The delivery's timestamp is not Unix seconds within the tolerance."""


def _key(secret: str) -> bytes:
    raw = secret.removeprefix("whsec_")
    if not raw:
        raise ValueError("a webhook secret is whsec_<base64 key>; the key is empty")
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ValueError("a webhook secret is whsec_<base64 key>; the key is not base64") from err


class WebhookVerifier:
    """Checks deliveries signed with any of ``secrets`` (``whsec_<base64>``;
    the prefix may be left out). Pass the old and the new secret during a
    rotation."""

    def __init__(
        self,
        *secrets: str,
        tolerance: float = DEFAULT_WEBHOOK_TOLERANCE,
        now: Callable[[], float] = time.time,
    ) -> None:
        if not secrets:
            raise ValueError("WebhookVerifier needs at least one secret")
        self._keys = [_key(s) for s in secrets]
        self._tolerance = tolerance if tolerance > 0 else DEFAULT_WEBHOOK_TOLERANCE
        self._now = now

    def __repr__(self) -> str:
        return f"WebhookVerifier(<{len(self._keys)} secret(s)>, tolerance={self._tolerance})"

    def verify(self, headers: Mapping[str, str], body: bytes) -> str:
        """Verify a delivery; return its ``webhook-id``.

        Raises :class:`WebhookTimestampError` or :class:`WebhookSignatureError`.
        Header names are matched case-insensitively.
        """
        h = {k.lower(): v for k, v in headers.items()}
        msg_id = h.get(WEBHOOK_ID_HEADER, "")
        ts = h.get(WEBHOOK_TIMESTAMP_HEADER, "")
        sigs = h.get(WEBHOOK_SIGNATURE_HEADER, "")
        if not msg_id or not ts or not sigs:
            raise WebhookSignatureError(f"missing {WEBHOOK_ID_HEADER}, {WEBHOOK_TIMESTAMP_HEADER} or {WEBHOOK_SIGNATURE_HEADER}")
        try:
            sec = int(ts)
        except ValueError:
            raise WebhookTimestampError(f"{WEBHOOK_TIMESTAMP_HEADER} is not Unix seconds") from None
        if abs(self._now() - sec) > self._tolerance:
            raise WebhookTimestampError("the delivery's timestamp is outside the tolerance")
        signed = f"{msg_id}.{ts}.".encode() + body
        for key in self._keys:
            want = hmac.new(key, signed, hashlib.sha256).digest()
            for sig in sigs.split():
                version, _, b64 = sig.partition(",")
                if version != "v1":
                    continue
                try:
                    got = base64.b64decode(b64, validate=True)
                except (binascii.Error, ValueError):
                    continue
                if hmac.compare_digest(got, want):
                    return msg_id
        raise WebhookSignatureError("no signature matches")
