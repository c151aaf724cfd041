"""Sandboxwich for Python: a typed client of the Sandboxwich sterile-cell API.

Start with :class:`Client` (or :class:`AsyncClient`): claim a cell with
:meth:`Client.claim`, present ``claim.proof()`` to exec, files, launch and
release, and wait for the proof of deletion with
:meth:`Client.wait_provider_absent`. Every error answer raises the subclass of
:class:`APIError` of its wire code. The lease attestation is an
:class:`Attestation`: it never shows in ``repr``, ``str``, logs or pickles.

The Inspect AI sandbox provider lives in :mod:`sandboxwich.inspect`.
"""

from ._core import (
    USER_AGENT,
    Claim,
    ExitEvent,
    LeasePage,
    OutputEvent,
    Proof,
    RetryPolicy,
    StreamEvent,
    UploadSource,
    __version__,
    uuid7,
)
from .aclient import AsyncClient
from .client import Client
from .errors import *  # noqa: F403
from .errors import ERRORS, APIError, ProtocolError, SandboxwichError, StreamIncompleteError, TransportError
from .models import *  # noqa: F403
from .models import ExecResult, Lease, LeaseStatus, Release
from .secret import Attestation

__all__ = [
    "APIError",
    "ERRORS",
    "USER_AGENT",
    "AsyncClient",
    "Attestation",
    "Claim",
    "Client",
    "ExecResult",
    "ExitEvent",
    "Lease",
    "LeasePage",
    "LeaseStatus",
    "OutputEvent",
    "Proof",
    "ProtocolError",
    "Release",
    "RetryPolicy",
    "SandboxwichError",
    "StreamEvent",
    "StreamIncompleteError",
    "TransportError",
    "UploadSource",
    "__version__",
    "uuid7",
] + [c.__name__ for c in ERRORS.values()]
