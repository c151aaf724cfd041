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
from datetime import datetime, timezone
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
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import override

from .. import errors
from .._core import Claim, Proof, uuid7
from ..aclient import AsyncClient
from ..models import Evidence, Release, User

logger = logging.getLogger(__name__)

STDIN_INLINE_MAX = 512 << 10
"""Larger exec input is staged through a 0600 file in the cell (the exec
body carries at most 1 MiB of stdin)."""

_IDENT = re.compile(r"[^A-Za-z0-9._:/-]")


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


class SandboxwichConfig(BaseModel):
    """Configuration of the ``sandboxwich`` sandbox (each field defaults to
    its ``SANDBOXWICH_*`` environment variable where it has one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(default_factory=lambda: _env("SANDBOXWICH_URL", "http://127.0.0.1:3217"))
    """The server's base URL."""
    token_file: str = Field(default_factory=lambda: _env("SANDBOXWICH_TOKEN_FILE"))
    """A file holding the tenant token (never the token itself)."""
    release: Release | None = None
    """The pool's signed release; default from SANDBOXWICH_RELEASE_FILE (its JSON)."""
    lease_seconds: int = 300
    """Requested lease length (the server clamps it to its maximum)."""
    exec_output_cap: int | None = None
    """Per-stream cap of exec output in bytes; default Inspect's limit."""
    working_dir: str = "/home/cell"
    """Where relative paths and cwd resolve; default the cell's home."""
    organization_id: str = "inspect"
    workspace_id: str | None = None
    """Default: the task name."""
    claim_timeout: float = 120.0
    """How long sample_init waits for a ready cell before failing the sample."""
    wait_for_deletion: bool = True
    """sample_cleanup waits for the provider's proof of deletion."""
    deletion_timeout: float = 120.0

    def resolved_release(self) -> Release:
        if self.release is not None:
            return self.release
        f = _env("SANDBOXWICH_RELEASE_FILE")
        if not f:
            raise ValueError("sandboxwich: no release configured (config 'release' or SANDBOXWICH_RELEASE_FILE)")
        return Release.model_validate_json(Path(f).read_text())


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
        if not config.token_file:
            raise ValueError("sandboxwich: no token_file configured (config 'token_file' or SANDBOXWICH_TOKEN_FILE)")
        self.client = AsyncClient(config.url, token_file=config.token_file)
        self.record = state_dir() / (self.runner_session_id + ".json")
        self.record.write_text(json.dumps({"url": config.url, "token_file": config.token_file, "runner_session_id": self.runner_session_id}))


def _resolve_config(config: SandboxEnvironmentConfigType | None) -> SandboxwichConfig:
    if config is None:
        return SandboxwichConfig()
    if isinstance(config, SandboxwichConfig):
        return config
    if isinstance(config, str):
        text = Path(config).read_text()
        if config.endswith((".yaml", ".yml")):
            import yaml  # type: ignore[import-untyped]

            return SandboxwichConfig.model_validate(yaml.safe_load(text))
        return SandboxwichConfig.model_validate_json(text)
    if isinstance(config, BaseModel):
        return SandboxwichConfig.model_validate(config.model_dump())
    raise TypeError(f"sandboxwich: unsupported config {type(config).__name__}")


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
        # The evidence is what the plane verified before it leased the
        # cell: read it while the sample runs, so that the cleanup waits
        # only for the release.
        self._evidence: asyncio.Future[Evidence] = asyncio.ensure_future(session.client.evidence(claim.proof().lease_id))
        self._evidence.add_done_callback(_retrieved)

    # Configuration.

    @override
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return SandboxwichConfig(**config)

    @override
    @classmethod
    def default_concurrency(cls) -> int | None:
        return None

    # Task life cycle.

    @classmethod
    def _session_for(cls, config: SandboxEnvironmentConfigType | None) -> _Session:
        cfg = _resolve_config(config)
        key = cfg.model_dump_json()
        s = cls._sessions.get(key)
        if s is None:
            s = _Session(cfg)
            cls._sessions[key] = s
        return s

    @override
    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        s = cls._session_for(config)
        try:
            await s.client.health()
            inventory = await s.client.inventory()
        except errors.SandboxwichError as e:
            raise RuntimeError(f"sandboxwich: the server at {s.config.url} is not usable: {e}") from None
        rel = s.release
        if not any(i.release_set_id == rel.release_set_id and i.runtime_class == rel.runtime_class and i.policy_digest == rel.policy_digest for i in inventory):
            have = ", ".join(f"{i.release_set_id}/{i.runtime_class}" for i in inventory) or "none"
            raise RuntimeError(f"sandboxwich: the server serves no cells of release {rel.release_set_id}/{rel.runtime_class} (it has: {have})")

    @override
    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        s = cls._session_for(config)
        claim = await cls._claim(s, _ident(s.config.workspace_id or task_name))
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
        _record(env)
        return {"default": env}

    @classmethod
    async def _claim(cls, s: _Session, workspace_id: str) -> Claim:
        """One cell for this sample attempt. The claim_id changes only after
        an empty answer (a fenced empty is final for its ID); a failure whose
        outcome is unknown is retried under the same ID, so a lost answer
        never leases twice."""
        import anyio

        deadline = time.monotonic() + s.config.claim_timeout
        claim_id = uuid7()
        thread = "attempt-" + str(claim_id)
        n = 0
        while True:
            n += 1
            try:
                c = await s.client.claim(
                    s.release,
                    organization_id=_ident(s.config.organization_id),
                    workspace_id=workspace_id,
                    thread_id=thread,
                    runner_session_id=s.runner_session_id,
                    lease_seconds=s.config.lease_seconds,
                    claim_id=claim_id,
                )
                if not c.empty:
                    return c
                claim_id = uuid7()  # empty is durable for that ID
                last = "no ready cell"
            except (errors.TransportError, errors.InternalError, errors.ClaimContendedError) as e:
                last = str(e)  # outcome unknown: same claim_id again
            if time.monotonic() >= deadline:
                raise RuntimeError(f"sandboxwich: no cell of release {s.release.release_set_id} within {s.config.claim_timeout:g} s ({last})")
            await anyio.sleep(min(2.0, 0.05 * 2 ** min(n, 6)))

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

    async def _release(self, *, wait: bool) -> None:
        c = self._session.client
        lease_id = self._proof.lease_id
        # The evidence read started at the claim; the release does not wait
        # for it (the evidence stays readable after the release).
        ev, rel = await asyncio.gather(self._evidence, c.release(self._proof, "destroyed"), return_exceptions=True)
        if isinstance(ev, BaseException):
            self.metadata["evidence_error"] = ev.__class__.__name__
        else:
            self.metadata["evidence"] = ev.model_dump(mode="json")
        try:
            if isinstance(rel, BaseException):
                raise rel
            st = rel
        except errors.SandboxwichError as e:
            # Outcome unknown, or the lease ended already: read it, and end it
            # without the attestation if it is still live.
            logger.warning("sandboxwich: release of lease %s failed (%s); revoking", lease_id, e.__class__.__name__)
            try:
                st = await c.lease(lease_id)
                if st.state == "leased" and not st.disposition:
                    st = await c.revoke(lease_id)
            except errors.SandboxwichError as e2:
                self.metadata["cleanup_error"] = e2.__class__.__name__
                _record(self)
                return
        if wait:
            try:
                st = await c.wait_provider_absent(lease_id, poll=0.1, timeout=self._session.config.deletion_timeout)
            except (TimeoutError, errors.SandboxwichError) as e:
                self.metadata["cleanup_error"] = e.__class__.__name__
        self.metadata.update({"final_state": st.state, "disposition": st.disposition, "provider_absent": st.provider_absent})
        _record(self)

    @override
    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        s = cls._sessions.pop(_resolve_config(config).model_dump_json(), None)
        if s is None:
            return
        try:
            if cleanup:
                await _revoke_orphans(s.client, s.runner_session_id)
                s.record.unlink(missing_ok=True)
        finally:
            await s.client.aclose()

    @override
    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        for f in sorted(state_dir().glob("*.json")):
            rec = json.loads(f.read_text())
            if id is not None and rec["runner_session_id"] != id:
                continue
            async with AsyncClient(rec["url"], token_file=rec["token_file"]) as c:
                n = await _revoke_orphans(c, rec["runner_session_id"])
            print(f"sandboxwich: runner session {rec['runner_session_id']}: revoked {n} orphaned lease(s)")
            f.unlink(missing_ok=True)

    # Commands and files.

    def _remaining(self) -> float:
        """The lease's remaining life: the bound of a command without a
        timeout (the server's default would be 60 s)."""
        assert self._lease_claim.lease is not None
        left = (self._lease_claim.lease.expires_at - datetime.now(timezone.utc)).total_seconds()
        return max(1.0, left)

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

        u = _user(user)
        c = self._session.client
        argv = list(cmd)
        stdin = input.encode() if isinstance(input, str) else input
        staged = None
        try:
            if stdin is not None and len(stdin) > STDIN_INLINE_MAX:
                staged = "/tmp/.sandboxwich-stdin-" + uuid.uuid4().hex  # noqa: S108 - in the cell, 0600, removed before the command runs
                await c.write_file(self._proof, staged, stdin, mode=0o600, user=u)
                argv = ["/bin/sh", "-c", 'exec 0<"$0" || exit 126; rm -f -- "$0"; exec "$@"', staged, *argv]
                stdin = None
            res = await c.exec(self._proof, argv, stdin=stdin, env=env, cwd=self._path(cwd or "."), user=u, timeout=timeout or self._remaining())
        except (errors.InvalidRequestError, errors.BadRequestError) as e:
            raise ValueError(f"sandboxwich: {e}") from None
        except errors.SandboxwichError as e:
            raise _unavailable(e) from None
        if res.timed_out:
            raise TimeoutError(f"command timed out after {timeout} s" if timeout else "command outlived the lease")
        if res.reason in ("killed", "cell_lost"):
            raise SandboxUnavailableError(f"sandboxwich: the cell ended during the command ({res.reason})")
        cap = self._session.config.exec_output_cap or SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        stdout = res.stdout.decode("utf-8", errors="replace")
        stderr = res.stderr.decode("utf-8", errors="replace")
        for raw in (res.stdout, res.stderr):
            if len(raw) > cap or res.truncated:
                raise OutputLimitExceededError(_size(cap), raw[:cap].decode("utf-8", errors="replace"))
        if res.exit_code == 126 and "permission denied" in stderr.lower():
            raise PermissionError(f"permission denied executing {cmd[0]!r}: {stderr.strip()}")
        return ExecResult(success=res.exit_code == 0, returncode=res.exit_code, stdout=stdout, stderr=stderr)

    @override
    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        try:
            await self._session.client.write_file(self._proof, self._path(file), data)
        except errors.InvalidRequestError as e:
            raise IsADirectoryError(f"{file}: {e.message}") from None
        except errors.SandboxwichError as e:
            raise _unavailable(e) from None

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    @override
    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        try:
            data = await self._session.client.read_file(self._proof, self._path(file), max_bytes=limit)
        except errors.PayloadTooLargeError:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None) from None
        except errors.InvalidRequestError as e:
            raise IsADirectoryError(f"{file}: {e.message}") from None
        except errors.SandboxwichError as e:
            raise _unavailable(e) from None
        return data.decode("utf-8") if text else data

    def default_polling_interval(self) -> float:
        return 0.2


def _retrieved(f: asyncio.Future[Evidence]) -> None:
    """Mark a failed evidence read as seen: a cleanup that never came (an
    interrupted run) must not log it as a forgotten exception."""
    if not f.cancelled():
        f.exception()


def _size(n: int) -> str:
    if n == SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE:
        return SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR
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


async def _revoke_orphans(c: AsyncClient, runner_session_id: str) -> int:
    """End every live lease of a runner session by revocation (its
    attestations died with the run) and wait for the proof of deletion."""
    n = 0
    ended = []
    async for lz in c.iter_leases(runner_session_id=runner_session_id, live=True):
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
