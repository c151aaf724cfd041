"""The Inspect AI sandbox provider ``sandboxwich``: each sample attempt runs in
its own sterile cell, claimed under a fenced claim_id at ``sample_init`` and
released, with proof of deletion, at ``sample_cleanup``; in between its
lease is renewed (kept alive), and a sample whose lease could not be renewed
fails with :class:`SandboxwichLeaseError`.

Use it with ``sandbox=("sandboxwich", "config.json")`` or
``SandboxEnvironmentSpec("sandboxwich", SandboxwichConfig(...))``.
"""

from ._provider import SandboxwichConfig, SandboxwichConfigError, SandboxwichLeaseError, SandboxwichSandboxEnvironment

__all__ = ["SandboxwichConfig", "SandboxwichConfigError", "SandboxwichLeaseError", "SandboxwichSandboxEnvironment"]
