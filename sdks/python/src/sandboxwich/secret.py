"""The lease attestation as a secret value."""

from __future__ import annotations

import os
from typing import Any, NoReturn

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

_REDACTED = "Attestation(REDACTED)"


class Attestation:
    """A lease attestation (``swla1_…``): a bearer secret for the claimer alone.

    ``repr``, ``str``, ``format``, logging and Pydantic's ``repr`` of a model
    holding it show ``Attestation(REDACTED)``; it refuses to be pickled or
    copied into another process by pickle. Read the raw value with
    :meth:`reveal`, or write it to a new file of mode 0600 with
    :meth:`write_to`. Keep it out of logs, argv, environment variables and
    error messages.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str) or not value:
            raise ValueError("an attestation is a non-empty string")
        self._value = value

    def reveal(self) -> str:
        """Return the raw attestation."""
        return self._value

    def write_to(self, path: str | os.PathLike[str]) -> None:
        """Write the attestation to a new file of mode 0600.

        The file must not exist (``FileExistsError`` otherwise), so an
        attestation never lands in a file someone else opened first.
        """
        fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, self._value.encode() + b"\n")
        finally:
            os.close(fd)

    @classmethod
    def read_from(cls, path: str | os.PathLike[str]) -> Attestation:
        """Read an attestation written by :meth:`write_to` (surrounding
        whitespace trimmed)."""
        with open(path, encoding="utf-8") as f:
            return cls(f.read().strip())

    def __repr__(self) -> str:
        return _REDACTED

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return _REDACTED

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Attestation):
            return NotImplemented
        import hmac

        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Attestation, len(self._value)))

    def __reduce__(self) -> NoReturn:
        raise TypeError("an Attestation cannot be pickled: it is a secret")

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        raise TypeError("an Attestation cannot be pickled: it is a secret")

    def __getstate__(self) -> NoReturn:
        raise TypeError("an Attestation cannot be pickled: it is a secret")

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def validate(v: Any) -> Attestation:
            if isinstance(v, Attestation):
                return v
            if isinstance(v, str):
                return Attestation(v)
            raise ValueError("expected a string")

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda v: v.reveal(), when_used="json"),
        )
