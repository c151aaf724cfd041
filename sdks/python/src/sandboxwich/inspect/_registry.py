"""Entry point of the ``inspect_ai`` plugin group: importing it registers the
``sandboxwich`` sandbox environment."""

from ._provider import SandboxwichSandboxEnvironment

__all__ = ["SandboxwichSandboxEnvironment"]
