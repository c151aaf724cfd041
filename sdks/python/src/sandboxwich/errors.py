"""Typed exceptions: one class per wire error ``code`` (CONTRACT §10.2, §17).

Every non-2xx answer of the server raises a subclass of :class:`APIError`
carrying ``status``, ``code``, ``message``, ``request_id`` and
``retry_after``. Branch on the class (or ``code``), never on ``message``.
No exception of this package contains an attestation or a token: request
bodies are never quoted.
"""

from __future__ import annotations


class SandboxwichError(Exception):
    """Base of every exception this package raises."""


class TransportError(SandboxwichError):
    """The request may or may not have reached the server (connection
    refused or reset, timeout, a response cut short)."""


class ProtocolError(SandboxwichError):
    """The server answered something this client cannot read."""


class StreamIncompleteError(SandboxwichError):
    """A streamed exec ended without an ``exit`` event: the command's
    outcome is unknown."""


class LeaseRenewalError(SandboxwichError):
    """A keep-alive (:meth:`Client.keep_alive`, :meth:`AsyncClient.keep_alive`)
    could not keep its lease alive: a renewal was refused (``cause`` is the
    :class:`APIError`, e.g. a :class:`ConflictError` when the lease is no
    longer live), the server could not be reached before the lease expired
    (``cause`` is the last failure), or the lease reached the cell's lifetime
    cap and expired (``cause`` is None). ``expired`` says whether the lease's
    last known expiry has passed. The lease's work should stop: the cell is
    gone or about to be."""

    def __init__(self, lease_id: object, message: str, cause: BaseException | None = None, expired: bool = False) -> None:
        self.lease_id = lease_id
        self.message = message
        self.cause = cause
        self.expired = expired
        super().__init__(f"lease {lease_id} could not be renewed: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.lease_id, self.message, self.cause, self.expired))


class APIError(SandboxwichError):
    """A non-2xx answer of the server."""

    code: str = ""
    default_status: int = 0

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        request_id: str | None = None,
        retry_after: float = 0.0,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.retry_after = retry_after
        super().__init__(str(self))

    def __str__(self) -> str:
        s = self.code + (": " + self.message if self.message else "") + f" (HTTP {self.status}"
        if self.request_id:
            s += f", request {self.request_id}"
        return s + ")"

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.status, self.code, self.message, self.request_id, self.retry_after))


class BadRequestError(APIError):
    """400 bad_request: an invalid release, binding or identifier."""

    code, default_status = "bad_request", 400


class InvalidRequestError(APIError):
    """400/422 invalid_request: malformed JSON, or a body of the wrong shape."""

    code, default_status = "invalid_request", 422


class UnauthorizedError(APIError):
    """401 unauthorized: a missing or unknown token, or the wrong principal."""

    code, default_status = "unauthorized", 401


class AuthorizationDeniedError(APIError):
    """403 authorization_denied: a release signature that does not verify."""

    code, default_status = "authorization_denied", 403


class NotFoundError(APIError):
    """404 not_found: unknown or foreign (never distinguished)."""

    code, default_status = "not_found", 404


class MethodNotAllowedError(APIError):
    """405 method_not_allowed."""

    code, default_status = "method_not_allowed", 405


class ConflictError(APIError):
    """409 conflict: the lease fence refused, or the lease is no longer live."""

    code, default_status = "conflict", 409


class ClaimContendedError(APIError):
    """409 sterile_cell_claim_contended: retry with the same claim_id."""

    code, default_status = "sterile_cell_claim_contended", 409


class RuntimeClassBoundaryUnverifiedError(APIError):
    """409 runtime_class_boundary_unverified: the cell was ended."""

    code, default_status = "runtime_class_boundary_unverified", 409


class PayloadTooLargeError(APIError):
    """413 payload_too_large."""

    code, default_status = "payload_too_large", 413


class UnsupportedMediaTypeError(APIError):
    """415 unsupported_media_type."""

    code, default_status = "unsupported_media_type", 415


class InternalError(APIError):
    """500 internal (no internals leaked)."""

    code, default_status = "internal", 500


class AuthNotConfiguredError(APIError):
    """500 auth_not_configured: the server has no token mode."""

    code, default_status = "auth_not_configured", 500


class InvalidIdempotencyKeyError(APIError):
    """400 invalid_idempotency_key."""

    code, default_status = "invalid_idempotency_key", 400


class IdempotencyKeyReusedError(APIError):
    """409 idempotency_key_reused: the same key with a different request."""

    code, default_status = "idempotency_key_reused", 409


class IdempotencyInProgressError(APIError):
    """409 idempotency_in_progress."""

    code, default_status = "idempotency_in_progress", 409


class ExecUnsupportedError(APIError):
    """501 exec_unsupported: the cell's provider cannot exec."""

    code, default_status = "exec_unsupported", 501


class RequestHeaderTooLargeError(APIError):
    """431 request_header_too_large."""

    code, default_status = "request_header_too_large", 431


class CellAgentUnverifiedError(APIError):
    """409 cell_agent_unverified: the cell was quarantined."""

    code, default_status = "cell_agent_unverified", 409


class ImageDigestUnverifiedError(APIError):
    """409 image_digest_unverified: the cell was quarantined."""

    code, default_status = "image_digest_unverified", 409


class UserUnsupportedError(APIError):
    """422 user_unsupported: the cell cannot run as that user."""

    code, default_status = "user_unsupported", 422


class CellFileNotFoundError(APIError):
    """404 file_not_found: no such file in the cell."""

    code, default_status = "file_not_found", 404


class FileAccessDeniedError(APIError):
    """403 file_access_denied: permission denied or a read-only file system."""

    code, default_status = "file_access_denied", 403


class InsufficientStorageError(APIError):
    """507 insufficient_storage: the cell has no space left."""

    code, default_status = "insufficient_storage", 507


class StoreUnavailableError(APIError):
    """503 store_unavailable: the server's database could not take the
    operation (unreachable, restarting, out of space). Retried like any 5xx;
    a claim retried under its claim_id gets what the fence recorded."""

    code, default_status = "store_unavailable", 503


class EventsExpiredError(APIError):
    """410 events_expired: resynchronise from state."""

    code, default_status = "events_expired", 410


class TooManyRequestsError(APIError):
    """429 too_many_requests: the token has too many requests in flight
    (SANDBOXWICH_MAX_REQUESTS_PER_PRINCIPAL); retried after Retry-After
    like any 429 by the calls that retry."""

    code, default_status = "too_many_requests", 429


class ImageNotAllowedError(APIError):
    """422 image_not_allowed: no pool of the claim's release allows the
    claim's image (or the image is a tag without a digest); nothing was
    recorded."""

    code, default_status = "image_not_allowed", 422


class EgressNotAllowedError(APIError):
    """422 egress_not_allowed: no pool's egress policy covers the claim's
    egress."""

    code, default_status = "egress_not_allowed", 422


ERRORS: dict[str, type[APIError]] = {
    c.code: c
    for c in (
        BadRequestError,
        InvalidRequestError,
        UnauthorizedError,
        AuthorizationDeniedError,
        NotFoundError,
        MethodNotAllowedError,
        ConflictError,
        ClaimContendedError,
        RuntimeClassBoundaryUnverifiedError,
        PayloadTooLargeError,
        UnsupportedMediaTypeError,
        InternalError,
        AuthNotConfiguredError,
        InvalidIdempotencyKeyError,
        IdempotencyKeyReusedError,
        IdempotencyInProgressError,
        ExecUnsupportedError,
        RequestHeaderTooLargeError,
        CellAgentUnverifiedError,
        ImageDigestUnverifiedError,
        UserUnsupportedError,
        CellFileNotFoundError,
        FileAccessDeniedError,
        InsufficientStorageError,
        StoreUnavailableError,
        EventsExpiredError,
        TooManyRequestsError,
        ImageNotAllowedError,
        EgressNotAllowedError,
    )
}
"""The exception class of each wire code."""

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "authorization_denied",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    431: "request_header_too_large",
    507: "insufficient_storage",
}


def code_for_status(status: int) -> str:
    """The code of an error answer that carried none (a proxy's page)."""
    return _STATUS_CODES.get(status, "internal")


def status_for_code(code: str) -> int:
    """The HTTP status a code has everywhere (for stream ``error`` events)."""
    cls = ERRORS.get(code)
    return cls.default_status if cls else 500


def api_error(status: int, code: str, message: str, request_id: str | None, retry_after: float = 0.0) -> APIError:
    """The typed exception of one error answer; an unknown code is a plain
    :class:`APIError`."""
    cls = ERRORS.get(code, APIError)
    return cls(status, code, message, request_id, retry_after)
