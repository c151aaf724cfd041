"""The ``sandboxwich`` sandbox environment of Inspect AI: one sterile cell
per sample attempt."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import re
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal, Union, overload

from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from typing_extensions import override

from .. import errors
from .._core import Claim, Proof, uuid7
from .._keepalive import AsyncKeepAlive
from ..aclient import AsyncClient
from ..models import Evidence, Release, User
from . import _compose

logger = logging.getLogger(__name__)

STDIN_INLINE_MAX = 512 << 10
"""Larger exec input is staged through a 0600 file in the cell (the exec
body carries at most 1 MiB of stdin)."""

_IDENT = re.compile(r"[^A-Za-z0-9._:/-]")

MAX_WAIT_SECONDS = 300
"""The longest wait_seconds the server accepts (CONTRACT §21)."""


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


try:  # Inspect prints a PrerequisiteError as its message alone, without a traceback.
    from inspect_ai._util.error import PrerequisiteError as _Prerequisite
except ImportError:  # pragma: no cover - another Inspect version
    _Prerequisite = Exception  # type: ignore[assignment,misc]


class SandboxwichConfigError(_Prerequisite, ValueError):
    """A configuration of the ``sandboxwich`` sandbox that cannot be used:
    one line saying what is wrong and what to do (never a value given)."""

    def __init__(self, message: str) -> None:
        self.message = message
        ValueError.__init__(self, message)

    def __str__(self) -> str:
        return str(self.message)


class SandboxwichLeaseError(RuntimeError):
    """The sample's lease ended under it: it could not be renewed, or it
    expired during a command. A RuntimeError, not a SandboxUnavailableError,
    so that it fails the sample (Inspect turns a SandboxUnavailableError of a
    tool call into a tool error and lets the sample go on, but the cell is
    gone). ``lease_id`` names the lease."""

    def __init__(self, message: str, lease_id: uuid.UUID) -> None:
        super().__init__(message)
        self.lease_id = lease_id


class SandboxwichConfig(BaseModel):
    """Configuration of the ``sandboxwich`` sandbox (each field defaults to
    its ``SANDBOXWICH_*`` environment variable where it has one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(default_factory=lambda: _env("SANDBOXWICH_URL", "http://127.0.0.1:3217"))
    """The server's base URL."""
    token_file: str = Field(default_factory=lambda: _env("SANDBOXWICH_TOKEN_FILE"))
    """A file holding the tenant token (never the token itself); default
    SANDBOXWICH_TOKEN_FILE, else the token in SANDBOXWICH_TOKEN (as the
    ``sandboxwich`` CLI reads it). A relative path in a config file is
    relative to that file's directory."""
    release: Release | None = None
    """The pool's signed release; default from SANDBOXWICH_RELEASE_FILE (its JSON)."""
    lease_seconds: int = Field(default=300, ge=1)
    """Requested lease length (the server clamps it to its maximum,
    SANDBOXWICH_MAX_LEASE_SECONDS, default 300)."""
    renew_lease_seconds: int | None = Field(default=None, ge=1)
    """The lease length asked for at each renewal: each sample's lease is
    kept alive from sample_init until sample_cleanup, renewed at about a
    third of its remaining life, up to the cell's lifetime cap (the pool's
    max_cell_seconds, default a day). Default: lease_seconds."""
    exec_output_cap: int | None = Field(default=None, ge=1)
    """Per-stream cap of exec output in bytes, asked of the server as
    ``max_output_bytes`` (at most its SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES,
    default 16 MiB); default Inspect's limit (10 MiB)."""
    working_dir: str = "/home/cell"
    """Where relative paths and cwd resolve; default the cell's home."""
    organization_id: str = "inspect"
    workspace_id: str | None = None
    """Default: the task name."""
    claim_timeout: float = 120.0
    """How long sample_init waits for a cell before failing the sample: its
    claim waits at the server (wait_seconds, at most 300 s a claim) for a
    ready cell or one made for it."""
    wait_for_deletion: bool = True
    """sample_cleanup waits for the provider's proof of deletion."""
    deletion_timeout: float = 120.0
    image: str | None = None
    """A cell of this image, an OCI reference pinned by digest
    (host/repo@sha256:<64 hex>): each sample's claim names it (CONTRACT
    §21), and a pool of the release must run it or an image class allow its
    repository. Default: the pool's own image. A Docker Compose file given
    as the config sets it from its one service's image."""
    egress: tuple[str, ...] | None = None
    """Narrows the egress of each sample's cell (CONTRACT §22): host[:port]
    entries (``*.suffix`` allowed; no port means 443 and 80) its pool's
    allow-list covers, ``[]`` for none. Default: the pool's policy (``none``
    unless the operator gave the pool an allow-list). A compose service's
    ``network_mode: none`` sets ``[]``."""

    @field_validator("image")
    @classmethod
    def _pinned(cls, v: str | None) -> str | None:
        if v is not None:
            why = _compose.pin_error(v)
            if why:
                raise ValueError(f"the image {why}")
        return v

    def resolved_release(self) -> Release:
        if self.release is not None:
            return self.release
        f = _env("SANDBOXWICH_RELEASE_FILE")
        if not f:
            raise ValueError("sandboxwich: no release configured (config 'release' or SANDBOXWICH_RELEASE_FILE)")
        try:
            return Release.model_validate_json(Path(f).read_text())
        except OSError as e:
            raise SandboxwichConfigError(f"sandboxwich: SANDBOXWICH_RELEASE_FILE {f}: {e.strerror or e}") from None
        except ValidationError as e:
            raise SandboxwichConfigError(f"sandboxwich: SANDBOXWICH_RELEASE_FILE {f} is not a release: {_first_error(e)}") from None

    def token_source(self) -> tuple[str | None, str | None]:
        """(token_file, None) or (None, the SANDBOXWICH_TOKEN env token)."""
        if self.token_file:
            return self.token_file, None
        tok = _env("SANDBOXWICH_TOKEN").strip()
        if tok:
            return None, tok
        raise SandboxwichConfigError("sandboxwich: no token configured: give token_file (a file holding the tenant token) or set SANDBOXWICH_TOKEN")


def state_dir() -> Path:
    """Where runs record their runner session, for ``inspect sandbox cleanup``."""
    d = _env("SANDBOXWICH_INSPECT_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "sandboxwich", "inspect-sessions")
    p = Path(d)
    p.mkdir(parents=True, exist_ok=True, mode=0o700)
    return p


def _ident(s: str) -> str:
    return (_IDENT.sub("-", s) or "x")[:200]


class _Session:
    """One configuration of one run (Inspect calls task_init once per
    configuration, as "startup"): its runner_session_id and client."""

    def __init__(self, config: SandboxwichConfig) -> None:
        self.config = config
        self.release = config.resolved_release()
        self.runner_session_id = "inspect-" + str(uuid7())
        token_file, token = config.token_source()
        self.token_file = os.path.abspath(token_file) if token_file else None
        try:
            self.client = AsyncClient(config.url, token=token, token_file=self.token_file)
        except OSError as e:
            raise SandboxwichConfigError(f"sandboxwich: token_file {token_file}: {e.strerror or e}") from None
        except ValueError as e:
            raise SandboxwichConfigError(f"sandboxwich: {e}") from None
        self.record = state_dir() / (self.runner_session_id + ".json")
        self.recorded = False
        self.checked = False
        """task_init found the server usable and serving the release (the
        configs of several images share one session: checked once)."""
        self.released: set[uuid.UUID] = set()
        """Leases whose release the server accepted: task_cleanup leaves
        them to finish (a revoke would contradict their disposition)."""

    def write_record(self) -> None:
        """Record the run for ``inspect sandbox cleanup`` once the server
        answered (before that the run can hold no lease). The token itself
        is never written: the record names its file, or SANDBOXWICH_TOKEN."""
        if self.recorded:
            return
        rec: dict[str, str] = {"url": self.config.url, "runner_session_id": self.runner_session_id}
        if self.token_file:
            rec["token_file"] = self.token_file
        else:
            rec["token_env"] = "SANDBOXWICH_TOKEN"  # noqa: S105 - the variable's name, not a token
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, self.record)
        self.recorded = True


_KNOWN = ", ".join(SandboxwichConfig.model_fields)


def _first_error(e: ValidationError) -> str:
    """One validation error, by location and kind, never quoting the input
    (it may be a secret)."""
    err = e.errors(include_input=False, include_url=False)[0]
    loc = ".".join(str(x) for x in err["loc"]) or "value"
    return f"{loc}: {err['msg']}"


def _validate(data: Any, where: str, compose: bool = True) -> SandboxwichConfig:
    """A SandboxwichConfig from a mapping (a Docker Compose mapping, with
    services:, when ``compose``), or one line saying what is wrong."""
    if not isinstance(data, dict):
        raise SandboxwichConfigError(f"sandboxwich: {where}: expected a mapping of config keys ({_KNOWN}), got {type(data).__name__}")
    if compose and "services" in data:
        return _from_compose(data, where, None)
    if "token" in data:
        raise SandboxwichConfigError(
            f"sandboxwich: {where}: an inline 'token' is not accepted; put the token in a file and give token_file, or set SANDBOXWICH_TOKEN"
        )
    unknown = [str(k) for k in data if k not in SandboxwichConfig.model_fields]
    if unknown:
        raise SandboxwichConfigError(f"sandboxwich: {where}: unknown key {unknown[0]!r} (known: {_KNOWN})")
    if data.get("image") is not None:
        why = _compose.pin_error(data["image"])
        if why:
            raise SandboxwichConfigError(f"sandboxwich: {where}: image {why}")
    try:
        return SandboxwichConfig.model_validate(data)
    except ValidationError as e:
        raise SandboxwichConfigError(f"sandboxwich: {where}: {_first_error(e)}") from None


def _from_compose(data: Any, where: str, path: str | None) -> SandboxwichConfig:
    """The config of a Docker Compose mapping: its one service's image (and
    working_dir), and the sandboxwich keys of its top-level x-sandboxwich
    mapping (else their defaults: SANDBOXWICH_URL, SANDBOXWICH_TOKEN_FILE or
    SANDBOXWICH_TOKEN, SANDBOXWICH_RELEASE_FILE). A relative token_file in
    x-sandboxwich is relative to the compose file (``path``)."""
    try:
        spec = _compose.parse(data, where)
    except _compose.ComposeError as e:
        raise SandboxwichConfigError(f"sandboxwich: {e}") from None
    cfg = _validate(spec.sandboxwich, f"{where} x-sandboxwich", compose=False) if spec.sandboxwich is not None else SandboxwichConfig()
    if path is not None and spec.sandboxwich and spec.sandboxwich.get("token_file") and not os.path.isabs(cfg.token_file):
        cfg = cfg.model_copy(update={"token_file": os.path.join(os.path.dirname(os.path.abspath(path)), cfg.token_file)})
    update: dict[str, Any] = {"image": spec.image}
    if spec.working_dir is not None:
        update["working_dir"] = spec.working_dir
    if spec.network_none:
        update["egress"] = ()
    return cfg.model_copy(update=update)


def _load_file(path: str) -> SandboxwichConfig:
    """The config of a file: a sandboxwich config (JSON, or YAML by its
    extension) or a Docker Compose file (by its name, or a YAML/JSON mapping
    with services:). A relative path is relative to the working directory,
    as Inspect leaves it: it makes a task's config path absolute (from the
    task file's directory) and a dataset sample's (from the dataset file's);
    a Sample built in code passes its path as written."""
    where = f"config {path}"
    if _compose.is_dockerfile(path):
        raise SandboxwichConfigError(
            f"sandboxwich: {where} is a Dockerfile; cells do not build images: build it, push it to a registry and name it"
            " by its digest in a compose file (image: host/repo@sha256:<64 hex>)"
        )
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SandboxwichConfigError(f"sandboxwich: {where}: {e.strerror or e}") from None
    compose = _compose.is_compose_file(path)
    try:
        if compose or path.endswith((".yaml", ".yml")):
            import yaml  # type: ignore[import-untyped]

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except ValueError as e:  # json.JSONDecodeError and yaml.YAMLError's line
        raise SandboxwichConfigError(f"sandboxwich: {where} is not valid {'YAML' if path.endswith(('.yaml', '.yml')) else 'JSON'}: {_one_line(e)}") from None
    except Exception as e:  # yaml.YAMLError is not a ValueError
        raise SandboxwichConfigError(f"sandboxwich: {where} is not valid YAML: {_one_line(e)}") from None
    if compose or (isinstance(data, dict) and "services" in data):
        return _from_compose(data, where, path)
    cfg = _validate(data, where)
    if cfg.token_file and not os.path.isabs(cfg.token_file):
        # Relative to the config file, wherever Inspect runs the task from.
        cfg = cfg.model_copy(update={"token_file": os.path.join(os.path.dirname(os.path.abspath(path)), cfg.token_file)})
    return cfg


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


def _resolve_config(config: SandboxEnvironmentConfigType | None) -> SandboxwichConfig:
    if config is None:
        return SandboxwichConfig()
    if isinstance(config, SandboxwichConfig):
        return config
    if isinstance(config, str):
        return _load_file(config)
    if isinstance(config, BaseModel):
        data = config.model_dump(by_alias=True)
        if "services" in data:  # Inspect's ComposeConfig: its unset keys are None
            return _from_compose(config.model_dump(by_alias=True, exclude_none=True), f"config {type(config).__name__}", None)
        return _validate(data, f"config {type(config).__name__}")
    raise SandboxwichConfigError(f"sandboxwich: unsupported config {type(config).__name__}: give a config file path or a SandboxwichConfig")


def _user(user: str | None) -> User | None:
    if user is None or user == "cell":
        return None
    if user in ("root", "0"):
        return "root"
    raise SandboxUserUnsupportedError(f"sandboxwich cells run commands as the default user or root, not {user!r}")


def _unavailable(e: Exception) -> Exception:
    """The Inspect exception of an SDK failure that is not the command's."""
    if isinstance(e, errors.UserUnsupportedError):
        return SandboxUserUnsupportedError(str(e))
    if isinstance(e, (errors.FileAccessDeniedError, errors.AuthorizationDeniedError)):
        return PermissionError(str(e))
    if isinstance(e, errors.CellFileNotFoundError):
        return FileNotFoundError(str(e))
    return SandboxUnavailableError(f"sandboxwich: {e}")


@sandboxenv(name="sandboxwich")
class SandboxwichSandboxEnvironment(SandboxEnvironment):
    """A sterile cell of a Sandboxwich server, claimed for one sample attempt
    and released (destroyed with proof) at its end."""

    _sessions: dict[str, _Session] = {}  # noqa: RUF012

    def __init__(self, session: _Session, claim: Claim) -> None:
        super().__init__()
        self._session = session
        self._lease_claim = claim
        self._proof: Proof = claim.proof()
        self.metadata: dict[str, Any] = {}
        assert claim.lease is not None
        self._expiry = claim.lease.expires_at
        """The latest expiry the server answered (claim, renewals)."""
        # The lease is renewed until the sample ends (CONTRACT §20); a
        # failed renewal fails the sample's next sandbox operation.
        self._keepalive: AsyncKeepAlive = session.client.keep_alive(self._proof, self._renew_seconds(), expires_at=claim.lease.expires_at)
        # The evidence is what the plane verified before it leased the
        # cell: read it while the sample runs, so that the cleanup waits
        # only for the release.
        self._evidence: asyncio.Future[Evidence] = asyncio.ensure_future(session.client.evidence(claim.proof().lease_id))
        self._evidence.add_done_callback(_retrieved)

    # Configuration.

    @override
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return _validate(config, "config")

    @override
    @classmethod
    def default_concurrency(cls) -> int | None:
        return None

    # Task life cycle.

    @classmethod
    def _session_for(cls, config: SandboxEnvironmentConfigType | None) -> tuple[_Session, str | None]:
        """The session of a config, and the image its samples claim. The
        configs that differ only in their image (a compose file per sample)
        share one session: one client, runner session and run record."""
        cfg = _resolve_config(config)
        key = _session_key(cfg)
        s = cls._sessions.get(key)
        if s is None:
            s = _Session(cfg.model_copy(update={"image": None}))
            cls._sessions[key] = s
        return s, cfg.image

    @override
    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        s, _ = cls._session_for(config)
        if s.checked:
            return
        try:
            await s.client.health()
            inventory = await s.client.inventory()
        except errors.SandboxwichError as e:
            raise RuntimeError(f"sandboxwich: the server at {s.config.url} is not usable: {e}") from None
        s.write_record()
        rel = s.release
        if not any(i.release_set_id == rel.release_set_id and i.runtime_class == rel.runtime_class and i.policy_digest == rel.policy_digest for i in inventory):
            have = ", ".join(f"{i.release_set_id}/{i.runtime_class}" for i in inventory) or "none"
            raise RuntimeError(f"sandboxwich: the server serves no cells of release {rel.release_set_id}/{rel.runtime_class} (it has: {have})")
        s.checked = True

    @override
    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        s, image = cls._session_for(config)
        claim = await cls._claim(s, _ident(s.config.workspace_id or task_name), image)
        s.write_record()  # task_init wrote it already, unless the caller skipped task_init
        env = cls(s, claim)
        assert claim.lease is not None
        rel = claim.lease.release
        env.metadata = {
            "lease_id": str(claim.lease.lease_id),
            "cell_id": str(claim.lease.cell_id),
            "claim_id": str(claim.claim_id),
            "runner_session_id": s.runner_session_id,
            "release": {"release_set_id": rel.release_set_id, "runtime_class": rel.runtime_class, "policy_digest": rel.policy_digest},
        }
        if image:
            env.metadata["image"] = image
        _record(env)
        return {"default": env}

    @classmethod
    async def _claim(cls, s: _Session, workspace_id: str, image: str | None = None) -> Claim:
        """One cell (of ``image``, if given) for this sample attempt. Each
        claim waits at the server for a cell (wait_seconds: what is left of
        claim_timeout, at most the server's 300 s), so a cell made or freed
        for it is leased to it as soon as it is ready, first come first
        served. The claim_id changes only after an empty answer (a fenced
        empty is final for its ID: the wait elapsed, or the server answered
        at once); a failure whose outcome is unknown is retried under the
        same ID with the same body, which joins the wait and never leases
        twice."""
        import anyio

        deadline = time.monotonic() + s.config.claim_timeout
        claim_id = uuid7()
        thread = "attempt-" + str(claim_id)
        wait = _wait_seconds(deadline)
        of = f"release {s.release.release_set_id}" + (f" and image {image}" if image else "")
        n = 0
        while True:
            n += 1
            started = time.monotonic()
            try:
                c = await s.client.claim(
                    s.release,
                    organization_id=_ident(s.config.organization_id),
                    workspace_id=workspace_id,
                    thread_id=thread,
                    runner_session_id=s.runner_session_id,
                    lease_seconds=s.config.lease_seconds,
                    claim_id=claim_id,
                    image=image,
                    wait_seconds=wait or None,
                    egress=s.config.egress,
                )
                if not c.empty:
                    return c
                last = f"the last claim was empty: {c.empty_reason}" if c.empty_reason else "no ready cell"
                claim_id = uuid7()  # empty is durable for that ID
                wait = -1  # a new claim: its wait is what is left
            except errors.ImageNotAllowedError as e:
                raise RuntimeError(
                    f"sandboxwich: no pool of release {s.release.release_set_id} serves image {image} ({e.message}):"
                    " a pool must run it, or an image class allow its repository"
                ) from None
            except errors.EgressNotAllowedError as e:
                raise RuntimeError(
                    f"sandboxwich: no pool of release {s.release.release_set_id} allows the egress {list(s.config.egress or ())} ({e.message}):"
                    " a claim may narrow its pool's allow-list, never widen it"
                ) from None
            except (errors.TransportError, errors.InternalError, errors.ClaimContendedError) as e:
                last = str(e)  # outcome unknown: the same claim_id and body again
            if time.monotonic() >= deadline:
                raise RuntimeError(f"sandboxwich: no cell of {of} within {s.config.claim_timeout:g} s (claim_timeout; {last})")
            if time.monotonic() - started < 1.0:
                # Answered at once (no wait, or a failure): back off before
                # the next claim, never past the deadline.
                await anyio.sleep(max(0.0, min(2.0, 0.05 * 2 ** min(n, 6), deadline - time.monotonic())))
            if wait < 0:
                wait = _wait_seconds(deadline)

    @override
    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for env in environments.values():
            if isinstance(env, SandboxwichSandboxEnvironment):
                await env._release(wait=env._session.config.wait_for_deletion and not interrupted)

    def _renew_seconds(self) -> int:
        return self._session.config.renew_lease_seconds or self._session.config.lease_seconds

    async def _release(self, *, wait: bool) -> None:
        c = self._session.client
        lease_id = self._proof.lease_id
        await self._keepalive.stop()
        ka = self._keepalive
        self.metadata["renewals"] = ka.renewals
        if ka.error is not None:
            self.metadata["renewal_error"] = ka.error.message
        # The evidence read started at the claim; the release does not wait
        # for it (the evidence stays readable after the release).
        ev, rel = await asyncio.gather(self._evidence, c.release(self._proof, "destroyed"), return_exceptions=True)
        if isinstance(ev, BaseException):
            self.metadata["evidence_error"] = ev.__class__.__name__
        else:
            self.metadata["evidence"] = ev.model_dump(mode="json")
        # What the log records is what is known: "release_status" says how the
        # lease was ended ("accepted": the server recorded the release;
        # "revoked": ended without the attestation; "ended": it had ended
        # already), and final_state / provider_absent appear only once the
        # provider proved the cell gone, or the lease was read ended.
        try:
            if isinstance(rel, BaseException):
                raise rel
            st = rel
            self.metadata["release_status"] = "accepted"
            self._session.released.add(lease_id)
        except errors.SandboxwichError as e:
            # Outcome unknown, or the lease ended already: read it, and end it
            # without the attestation if it is still live.
            logger.warning("sandboxwich: release of lease %s failed (%s); revoking", lease_id, e.__class__.__name__)
            try:
                st = await c.lease(lease_id)
                if st.state == "leased" and not st.disposition:
                    st = await c.revoke(lease_id)
                    self.metadata["release_status"] = "revoked"
                else:
                    self.metadata["release_status"] = "ended" if st.state != "leased" else "accepted"
            except errors.SandboxwichError as e2:
                self.metadata["cleanup_error"] = e2.__class__.__name__
                _record(self)
                return
        if st.disposition:
            self.metadata["disposition"] = st.disposition
        if wait:
            try:
                st = await c.wait_provider_absent(lease_id, poll=0.1, timeout=self._session.config.deletion_timeout)
            except (TimeoutError, errors.SandboxwichError) as e:
                self.metadata["cleanup_error"] = e.__class__.__name__
        if st.provider_absent or st.state != "leased":
            self.metadata.update({"final_state": st.state, "disposition": st.disposition, "provider_absent": st.provider_absent})
        _record(self)

    @override
    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        s = cls._sessions.pop(_session_key(_resolve_config(config)), None)
        if s is None:
            return
        try:
            if cleanup and s.recorded:  # unrecorded: the server never answered, so no lease exists
                await _revoke_orphans(s.client, s.runner_session_id, skip=s.released)
                s.record.unlink(missing_ok=True)
        finally:
            await s.client.aclose()

    @override
    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """Revoke the live leases of every recorded run (or of runner
        session ``id``). A record that cannot be cleaned (unreadable, its
        server or token gone) is reported, kept and skipped; the rest are
        cleaned and their records removed."""
        skipped = 0
        for f in sorted(state_dir().glob("*.json")):
            try:
                rec = json.loads(f.read_text())
                session = rec["runner_session_id"]
                if not isinstance(session, str):
                    raise TypeError("runner_session_id is not a string")
            except (OSError, ValueError, KeyError, TypeError) as e:
                print(f"sandboxwich: {f}: not a readable run record ({_one_line(e)}); skipped")
                skipped += 1
                continue
            if id is not None and session != id:
                continue
            try:
                token_file = rec.get("token_file")
                token = None if token_file else _env("SANDBOXWICH_TOKEN").strip() or None
                if not token_file and not token:
                    raise SandboxwichConfigError("no token_file recorded and SANDBOXWICH_TOKEN is not set")
                async with AsyncClient(rec["url"], token=token, token_file=token_file) as c:
                    n = await _revoke_orphans(c, session)
            except (errors.SandboxwichError, OSError, ValueError, KeyError, TypeError) as e:
                print(f"sandboxwich: runner session {session} at {rec.get('url')}: not cleaned ({e.__class__.__name__}: {_one_line(e)}); record kept: {f}")
                skipped += 1
                continue
            print(f"sandboxwich: runner session {session}: revoked {n} orphaned lease(s)")
            f.unlink(missing_ok=True)
        if skipped:
            print(f"sandboxwich: {skipped} record(s) not cleaned (see above); delete a record that no longer matters")

    # Commands and files.

    def _expires_at(self) -> datetime:
        """The latest expiry the server answered."""
        ka = self._keepalive.expires_at
        if ka is not None and ka > self._expiry:
            self._expiry = ka
        return self._expiry

    def _remaining(self) -> float:
        """The lease's remaining life: the bound of a command without a
        timeout (the server's default would be 60 s)."""
        left = (self._expires_at() - datetime.now(timezone.utc)).total_seconds()
        return max(1.0, left)

    def _lease_error(self) -> SandboxwichLeaseError | None:
        """The failure of the sample's keep-alive, as the sample's error."""
        err = self._keepalive.error
        if err is None:
            return None
        return SandboxwichLeaseError(
            f"sandboxwich: the lease {self._proof.lease_id} of this sample could not be renewed ({err.message}); the cell is gone or going",
            self._proof.lease_id,
        )

    def _check_lease(self) -> None:
        err = self._lease_error()
        if err is not None:
            raise err

    async def _failed(self, e: errors.SandboxwichError) -> Exception:
        """The Inspect exception of an SDK failure of an operation: the
        lease's own failure first, when the keep-alive reported one; a
        conflict after the lease's expiry says that it expired."""
        err = self._lease_error()
        if err is not None:
            return err
        if isinstance(e, errors.ConflictError) and await self._ended_by_expiry():
            return self._expired(str(e))
        return _unavailable(e)

    def _expired(self, how: str) -> SandboxwichLeaseError:
        return SandboxwichLeaseError(
            f"sandboxwich: the lease {self._proof.lease_id} expired ({how}; it expired at {self._expires_at().isoformat()});"
            " the cell is gone. The lease is renewed while the sample runs, up to the cell's lifetime cap",
            self._proof.lease_id,
        )

    async def _extend_for(self, timeout: float) -> None:
        """Before a command that may run longer than the lease's remaining
        life (the server bounds a command by it): renew now, asking for the
        command's length (clamped by the server to its maximum lease)."""
        if timeout <= self._remaining() - 1:
            return
        try:
            lz = await self._session.client.renew(self._proof, max(self._renew_seconds(), int(-(-timeout // 1)) + 5))
        except errors.SandboxwichError as e:
            logger.warning("sandboxwich: renewal of lease %s before a command failed (%s)", self._proof.lease_id, e.__class__.__name__)
            return  # the keep-alive reports a lasting failure
        if lz.expires_at > self._expiry:
            self._expiry = lz.expires_at

    async def _ended_by_expiry(self) -> bool:
        """Whether a command answered "killed" because the lease expired
        (not a release or revoke): its known expiry has passed, and the
        lease's events record no release or revocation."""
        ka = self._keepalive.error
        if ka is not None and ka.expired:
            return True
        if datetime.now(timezone.utc) < self._expires_at() - timedelta(seconds=1):
            return False
        try:
            page = await self._session.client.events(lease_id=self._proof.lease_id, limit=100)
        except errors.SandboxwichError:
            return True
        return not any(ev.type in ("lease.released", "lease.revoked") for ev in page.events)

    def _path(self, p: str) -> str:
        return p if posixpath.isabs(p) else posixpath.normpath(posixpath.join(self._session.config.working_dir, p))

    @override
    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> Any:
        from inspect_ai.util import ExecResult

        self._check_lease()
        u = _user(user)
        c = self._session.client
        cap = self._session.config.exec_output_cap or SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        argv = list(cmd)
        stdin = input.encode() if isinstance(input, str) else input
        staged = None
        try:
            if stdin is not None and len(stdin) > STDIN_INLINE_MAX:
                staged = "/tmp/.sandboxwich-stdin-" + uuid.uuid4().hex  # noqa: S108 - in the cell, 0600, removed before the command runs
                await c.write_file(self._proof, staged, stdin, mode=0o600, user=u)
                argv = ["/bin/sh", "-c", 'exec 0<"$0" || exit 126; rm -f -- "$0"; exec "$@"', staged, *argv]
                stdin = None
            if timeout:
                await self._extend_for(timeout)
            bound = timeout or self._remaining()
            res = await c.exec(
                self._proof,
                argv,
                stdin=stdin,
                env=env,
                cwd=self._path(cwd or "."),
                user=u,
                timeout=bound,
                max_output_bytes=cap,
            )
        except (errors.InvalidRequestError, errors.BadRequestError) as e:
            raise ValueError(f"sandboxwich: {e}") from None
        except errors.SandboxwichError as e:
            raise (await self._failed(e)) from None
        if (res.reason == "killed" or res.timed_out) and await self._ended_by_expiry():
            # The server bounds a command by the lease's remaining life, so
            # a lease that ran out under a command answers killed or
            # timed_out; either way the cell is gone.
            raise self._lease_error() or self._expired(f"during the command, which answered {res.reason}")
        if res.timed_out:
            if timeout and res.duration_ms < timeout * 1000 - 1000:
                raise TimeoutError(
                    f"command timed out after {res.duration_ms / 1000:.0f} s of the {timeout} s asked for:"
                    " the server bounds a command by the lease's remaining life when it starts"
                )
            raise TimeoutError(f"command timed out after {timeout} s" if timeout else f"command timed out after {bound:.0f} s (the lease's remaining life)")
        if res.reason in ("killed", "cell_lost"):
            raise SandboxUnavailableError(f"sandboxwich: the cell ended during the command ({res.reason})")
        longest = max(len(res.stdout), len(res.stderr))
        if res.truncated or longest > cap:
            # The cap that applied: the answer's max_output_bytes, else (a
            # server that does not say) the length it cut a stream at.
            applied = res.max_output_bytes or (min(cap, longest) if res.truncated and longest else cap)
            limit = _size(applied) if applied == cap else f"{_size(applied)} (the server's cap; {_size(cap)} was asked for)"
            raw = res.stdout if len(res.stdout) >= len(res.stderr) else res.stderr
            raise OutputLimitExceededError(limit, raw[:applied].decode("utf-8", errors="replace"))
        stdout = res.stdout.decode("utf-8", errors="replace")
        stderr = res.stderr.decode("utf-8", errors="replace")
        if res.exit_code == 126 and "permission denied" in stderr.lower():
            raise PermissionError(f"permission denied executing {cmd[0]!r}: {stderr.strip()}")
        return ExecResult(success=res.exit_code == 0, returncode=res.exit_code, stdout=stdout, stderr=stderr)

    @override
    async def write_file(self, file: str, contents: str | bytes) -> None:
        self._check_lease()
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        try:
            await self._session.client.write_file(self._proof, self._path(file), data)
        except errors.InvalidRequestError as e:
            raise IsADirectoryError(f"{file}: {e.message}") from None
        except errors.SandboxwichError as e:
            raise (await self._failed(e)) from None

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    @override
    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:
        self._check_lease()
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        try:
            data = await self._session.client.read_file(self._proof, self._path(file), max_bytes=limit)
        except errors.PayloadTooLargeError:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None) from None
        except errors.InvalidRequestError as e:
            raise IsADirectoryError(f"{file}: {e.message}") from None
        except errors.SandboxwichError as e:
            raise (await self._failed(e)) from None
        return data.decode("utf-8") if text else data

    def default_polling_interval(self) -> float:
        return 0.2


def _session_key(cfg: SandboxwichConfig) -> str:
    return cfg.model_dump_json(exclude={"image"})


def _wait_seconds(deadline: float) -> int:
    """The wait_seconds of a claim made now: what is left until the
    deadline, in whole seconds, at most the server's 300."""
    return max(0, min(MAX_WAIT_SECONDS, int(deadline - time.monotonic())))


def _retrieved(f: asyncio.Future[Evidence]) -> None:
    """Mark a failed evidence read as seen: a cleanup that never came (an
    interrupted run) must not log it as a forgotten exception."""
    if not f.cancelled():
        f.exception()


def _size(n: int) -> str:
    """A byte count as Inspect writes its limits: "10 MiB", "1 KiB", "1000 bytes"."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _record(env: SandboxwichSandboxEnvironment) -> None:
    """Put the cell's record into the sample's metadata in the eval log."""
    try:
        from inspect_ai.solver._task_state import sample_state

        state = sample_state()
    except Exception:
        state = None
    if state is not None:
        state.metadata["sandboxwich"] = dict(env.metadata)


async def _revoke_orphans(c: AsyncClient, runner_session_id: str, skip: set[uuid.UUID] | None = None) -> int:
    """End every live lease of a runner session by revocation (its
    attestations died with the run) and wait for the proof of deletion;
    leases in ``skip`` (released already) are left to finish."""
    n = 0
    ended = []
    async for lz in c.iter_leases(runner_session_id=runner_session_id, live=True):
        if skip and lz.lease_id in skip:
            continue
        try:
            await c.revoke(lz.lease_id)
            ended.append(lz.lease_id)
            n += 1
        except errors.ConflictError:
            pass  # ended meanwhile
    for lease_id in ended:
        try:
            await c.wait_provider_absent(lease_id, poll=0.2, timeout=60)
        except (TimeoutError, errors.SandboxwichError) as e:
            logger.warning("sandboxwich: lease %s revoked, deletion not proven yet (%s)", lease_id, e.__class__.__name__)
    return n
