"""Pydantic models of the Sandboxwich /v1 wire (CONTRACT §1-§15).

Every model mirrors one schema of the server's ``openapi.json`` (the test
``tests/test_openapi_models.py`` compares fields, required sets and enums),
named after it. Response models ignore fields they do not know, so a newer
server stays readable; request models are what the client sends.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from .secret import Attestation

RuntimeClass = Literal["kata_microvm", "gvisor_lower_risk"]
CellState = Literal["ready", "leased", "destroyed", "quarantined"]
Disposition = Literal["destroyed", "quarantined"]
User = Literal["cell", "root"]
ExecReason = Literal["exited", "timed_out", "killed", "cell_lost"]
LaunchPhase = Literal["accepted", "running", "terminal"]
ProviderMode = Literal["apply", "dry_run"]
ImagePullState = Literal["queued", "pulling", "cached", "failed"]
EmptyReason = Literal["no_inventory", "expires_too_soon", "held_back", "wait_elapsed", "capacity"]
"""Why a claim that carried ``image`` or ``wait_seconds`` found no cell
(CONTRACT §21). :attr:`ClaimResponse.empty_reason` is a plain string, so
that a reason a newer server adds still decodes."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Release(_Model):
    """The signed trust class of a cell (CONTRACT §2)."""

    release_set_id: str
    runtime_class: RuntimeClass
    policy_digest: str
    signature: str


class ClaimRequest(_Model):
    """Body of ``POST /v1/sterile-cells/claim``."""

    claim_id: UUID | None = None
    release: Release
    organization_id: str
    workspace_id: str
    thread_id: str
    runner_session_id: str
    lease_seconds: int | None = None
    image: str | None = None
    """A cell of this image, pinned by digest (CONTRACT §21)."""
    wait_seconds: int | None = None
    """How long the claim may wait for a cell (0 to 300)."""
    egress: list[str] | None = None
    """Narrows the serving pool's egress policy (CONTRACT §22); [] for none."""


class Lease(_Model):
    """A lease: the binding of one cell to one tenant binding."""

    lease_id: UUID
    cell_id: UUID
    generation: int
    release: Release
    organization_id: str
    workspace_id: str
    thread_id: str
    runner_session_id: str
    expires_at: datetime


class ClaimResponse(_Model):
    """Answer of a claim. ``lease`` is null for an empty claim."""

    ok: bool
    lease: Lease | None
    lease_attestation: Attestation | None
    empty_reason: str | None = None
    """Why a claim that carried ``image`` or ``wait_seconds`` > 0 is empty
    (one of :data:`EmptyReason`); absent otherwise."""


class ValidateRequest(_Model):
    """Body of validate: the lease fence."""

    lease_attestation: Attestation
    generation: int
    organization_id: str
    workspace_id: str
    thread_id: str
    runner_session_id: str


class ValidateResponse(_Model):
    ok: bool
    lease: Lease


class RenewRequest(ValidateRequest):
    """Body of renew (CONTRACT §20): the lease fence plus the lease length
    asked for from now (clamped by the server into [1, its maximum])."""

    lease_seconds: int


class RenewResponse(ValidateResponse):
    """Answer of renew: the same lease with the expiry it now has (never
    earlier than before; at most the cell's lifetime cap)."""


class ReleaseRequest(ValidateRequest):
    """Body of release: the lease fence plus the requested disposition."""

    disposition: Disposition


class LeaseStatus(_Model):
    """Status of a lease (``GET /v1/sterile-cell-leases/{id}``)."""

    lease_id: UUID
    cell_id: UUID
    generation: int
    state: CellState
    disposition: Disposition | None
    provider_absent: bool
    cleanup_pending: bool
    provider_mode: ProviderMode | None = None


class StatusResponse(_Model):
    ok: bool
    status: LeaseStatus


class ExecRequest(ValidateRequest):
    """Body of exec (CONTRACT §6, §14)."""

    argv: list[str]
    stdin_base64: str | None = None
    env: dict[str, str] | None = None
    timeout_seconds: int | None = None
    cwd: str | None = None
    user: User | None = None
    max_output_bytes: int | None = None
    """Per-stream output cap asked for (CONTRACT §25): up to the server's
    SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES; default its 1 MiB cap."""


class ExecExit(_Model):
    """How a command ended: the exec answer without its output, and the
    data of a stream's ``exit`` event."""

    ok: bool
    exit_code: int
    truncated: bool
    max_output_bytes: int
    """The cap of each of stdout and stderr that applied (CONTRACT §25)."""
    duration_ms: int
    timed_out: bool
    signal: str | None
    reason: ExecReason
    message: str | None = None
    """Why a killed command was killed (its lease expired, or was released
    or revoked); absent otherwise (CONTRACT §20)."""


class ExecResponse(ExecExit):
    """Answer of a plain exec; the streams are base64."""

    stdout_base64: str
    stderr_base64: str


class ExecOutput(_Model):
    """Data of a stream's ``stdout``/``stderr`` event."""

    data_base64: str


class StreamError(_Model):
    """Data of a stream's ``error`` event."""

    code: str
    message: str


class LeaseSummary(_Model):
    """One lease of a listing (CONTRACT §14)."""

    lease_id: UUID
    cell_id: UUID
    generation: int
    state: CellState
    disposition: Disposition | None
    provider_absent: bool
    cleanup_pending: bool
    organization_id: str
    workspace_id: str
    thread_id: str
    runner_session_id: str
    expires_at: datetime
    release_set_id: str


class LeasesResponse(_Model):
    ok: bool
    leases: list[LeaseSummary]
    next_cursor: str | None


class RevokeRequest(_Model):
    disposition: Disposition | None = None


class InventoryEntry(_Model):
    """Ready cells of one release of the caller's tenant."""

    release_set_id: str
    runtime_class: RuntimeClass
    policy_digest: str
    ready: int
    max_lease_seconds: int
    images: list[str] | None = None
    """The repositories the tenant's image classes of the release allow
    (CONTRACT §21); None (as are the four below) for a release without an
    image class. ``ready`` never counts an image class's cells."""
    cached: int | None = None
    """Images (distinct digests) the image classes' caches hold that they allow."""
    max_cells: int | None = None
    max_cold: int | None = None
    warm_per_image: int | None = None


class InventoryResponse(_Model):
    ok: bool
    inventory: list[InventoryEntry]


class Evidence(_Model):
    """What the plane read back from the provider and the agent (CONTRACT §15)."""

    cell_id: UUID
    pool: str
    provider: str
    provider_mode: ProviderMode
    runtime_class: RuntimeClass
    image_digest: str | None
    agent_digest: str | None
    egress: str
    """The cell's egress policy in canonical form (CONTRACT §22): ``none``, or
    ``host:port`` lines."""
    egress_digest: str
    """The SHA-256 (lowercase hex) of ``egress``."""
    admitted_at: datetime
    last_verified_at: datetime


class EgressHost(_Model):
    """Connections of a lease's cell to one host through the egress gateway
    (CONTRACT §22); ``host`` is ``"-"`` for those that named none."""

    host: str
    allowed: int
    refused: int


class EgressResponse(_Model):
    ok: bool
    hosts: list[EgressHost]


class EvidenceResponse(_Model):
    ok: bool
    evidence: Evidence


class PoolMembers(_Model):
    provisioning: int
    ready: int
    leased: int
    stopping: int
    cleanup_pending: int
    destroyed: int
    quarantined: int


class Pool(_Model):
    """One pool as an operator sees it (``GET /v1/pools``)."""

    name: str
    provider: str
    mode: ProviderMode
    tenant_id: str
    release: Release
    target: int
    ready_floor: int
    max_provisioning: int
    ready_ttl_seconds: int
    members: PoolMembers
    last_reconcile_at: datetime | None
    last_error: str | None
    images: list[str] | None = None
    """An image class's allowed repositories (CONTRACT §21); None for a fixed pool."""
    max_cells: int | None = None
    max_cold: int | None = None
    warm_per_image: int | None = None
    image_cells: list[ImageCells] | None = None
    """An image class's images as of its reconciler's last pass."""


class ImageCells(_Model):
    """One image of an image class in a pool listing."""

    image: str
    ready: int
    provisioning: int
    waiting: int


class PrefetchRequest(_Model):
    """Body of ``POST /v1/images/prefetch`` (CONTRACT §21)."""

    pool: str
    images: list[str]


class ImageState(_Model):
    """One image of a pool's image cache (``GET /v1/images``, the prefetch's answer)."""

    image: str
    state: ImagePullState
    code: Literal["insufficient_storage", "image_pull_failed", None]
    message: str | None
    bytes: int | None


class ImagesResponse(_Model):
    ok: bool
    pool: str
    images: list[ImageState]


class PoolsResponse(_Model):
    ok: bool
    pools: list[Pool]


class ErrorResponse(_Model):
    ok: bool
    code: str
    message: str


class HealthComponent(_Model):
    ok: bool
    message: str | None  # the server emits null when ok


class Health(_Model):
    ok: bool
    service: str
    checked_at: datetime
    """When the server checked (RFC 3339 UTC; CONTRACT §12)."""
    database: HealthComponent | None = None
    auth: HealthComponent | None = None


class LaunchRequest(ValidateRequest):
    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None
    user: User | None = None


class Launch(_Model):
    """Status of the lease's resident workload."""

    phase: LaunchPhase
    pid: int | None
    exit_code: int | None
    signal: str | None
    reason: ExecReason | None


class LaunchResponse(_Model):
    ok: bool
    launch: Launch


class FileWriteRequest(ValidateRequest):
    """The ``proof`` part of a file write."""

    path: str
    mode: str | None = None
    user: User | None = None


class FileWriteResponse(_Model):
    ok: bool
    path: str
    size: int
    sha256: str


class FileReadRequest(ValidateRequest):
    path: str
    max_bytes: int | None = None
    user: User | None = None


class CellClaim(_Model):
    claim_id: UUID
    lease_id: UUID
    generation: int
    expires_at: datetime


class Cell(_Model):
    """A cell as its worker sees it (CONTRACT §7)."""

    cell_id: UUID
    worker_id: UUID
    provider_cell_id: str
    state: CellState
    generation: int
    release: Release
    expires_at: datetime
    disposition: Disposition | None


class PrepareRequest(_Model):
    cell_id: UUID
    release: Release
    provider_cell_id: str
    expires_at: datetime


class CellResponse(_Model):
    ok: bool
    cell: Cell


class WorkerCellResponse(_Model):
    ok: bool
    cell: Cell
    claim: CellClaim | None


class RetireRequest(_Model):
    generation: int


class DestroyRequest(_Model):
    lease_id: UUID
    generation: int
    disposition: Disposition


class ExecResult(_Model):
    """A finished command, decoded (what :meth:`Client.exec` returns)."""

    exit_code: int
    stdout: bytes = Field(repr=False)
    stderr: bytes = Field(repr=False)
    truncated: bool
    timed_out: bool
    signal: str | None
    reason: ExecReason
    duration_ms: int
    max_output_bytes: int | None = None
    """The cap of each of stdout and stderr that applied."""
    message: str | None = None
    """Why a killed command was killed (its lease expired, or was released
    or revoked); ``None`` otherwise."""


EventType = Literal[
    "cell.ready",
    "cell.leased",
    "cell.destroyed",
    "cell.quarantined",
    "member.provisioning",
    "member.ready",
    "member.leased",
    "member.stopping",
    "member.cleanup_pending",
    "member.destroyed",
    "member.quarantined",
    "lease.released",
    "lease.revoked",
    "lease.expired",
    "lease.renewed",
]


class Event(_Model):
    """One entry of the event log (CONTRACT §16). ``id`` increases strictly
    in commit order; store the last one processed and resume after it."""

    id: str
    type: EventType
    at: datetime
    tenant_id: str
    pool: str | None
    cell_id: UUID
    lease_id: UUID | None
    member_id: UUID | None
    generation: int | None
    from_: str | None = Field(alias="from")
    to: str | None
    disposition: Disposition | None
    provider_absent: bool
    reason: Literal[
        "claimed",
        "released",
        "revoked",
        "expired",
        "renewed",
        "ready_ttl",
        "fence_mismatch",
        "runtime_unverified",
        "image_unverified",
        "agent_unverified",
        "cell_lost",
        "deletion_proven",
        "deletion_uncertain",
        "provision_failed",
        "worker_destroy",
        "worker_retire",
        None,
    ]


class EventsResponse(_Model):
    """Body of ``GET /v1/events?format=json``."""

    ok: bool
    events: list[Event]
    next_after: str


class WebhookDelivery(_Model):
    """One delivery of an event to a webhook endpoint (operator view)."""

    endpoint: str
    event_id: str
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    next_at: datetime | None
    last_status: int
    last_error: str
    created_at: datetime
    updated_at: datetime


class DeliveriesResponse(_Model):
    """Body of ``GET /v1/webhooks/deliveries``."""

    ok: bool
    deliveries: list[WebhookDelivery]
    next_after: str
