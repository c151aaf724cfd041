"""The Pydantic models match the server's openapi.json: no drift between the
Go server and the Python models."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import sandboxwich
from sandboxwich import models

OPENAPI = Path(__file__).resolve().parents[3] / "httpapi" / "openapi.json"


def _doc() -> dict[str, Any]:
    return json.loads(OPENAPI.read_text())  # type: ignore[no-any-return]


def _schemas() -> dict[str, Any]:
    return _doc()["components"]["schemas"]  # type: ignore[no-any-return]


# Schemas that are not bodies of JSON objects the client decodes or encodes
# (scalars, and the multipart envelope, which the client writes by hand).
NOT_MODELS = {"FileWriteUpload"}


def _object_schemas() -> list[str]:
    return [n for n, s in _schemas().items() if s.get("type") == "object" and n not in NOT_MODELS]


def _resolve(s: dict[str, Any]) -> dict[str, Any]:
    while True:
        if "$ref" in s:
            node: Any = _doc()
            for part in s["$ref"].removeprefix("#/").split("/"):
                node = node[part]
            s = node
        elif "allOf" in s and len(s["allOf"]) == 1:
            s = s["allOf"][0]
        else:
            return s


def _literals(tp: Any) -> set[Any] | None:
    """The values of the Literal inside an annotation, if any."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return set(typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        for a in typing.get_args(tp):
            lit = _literals(a)
            if lit is not None:
                return lit
    return None


def test_every_object_schema_has_a_model() -> None:
    missing = [n for n in _object_schemas() if not isinstance(getattr(models, n, None), type)]
    assert missing == []


@pytest.mark.parametrize("name", _object_schemas())
def test_model_matches_schema(name: str) -> None:
    schema = _schemas()[name]
    model: type[BaseModel] = getattr(models, name)
    # Wire names: a field whose name is a Python keyword ("from") has an alias.
    fields = {f.alias or n: f for n, f in model.model_fields.items()}
    attrs = {f.alias or n: n for n, f in model.model_fields.items()}
    props = schema.get("properties", {})
    assert set(fields) == set(props), f"{name}: fields differ"
    required = set(schema.get("required", []))
    model_required = {n for n, f in fields.items() if f.is_required()}
    assert model_required == required, f"{name}: required fields differ"
    hints = typing.get_type_hints(model)
    for field, ps in props.items():
        s = _resolve(ps)
        enum = s.get("enum")
        if enum is None or s.get("type") == "boolean":
            continue
        if field == "code" and name in ("ErrorResponse", "StreamError"):
            # Error codes stay strings, so that a newer server's code still
            # decodes; test_every_wire_code_has_its_exception covers the enum.
            continue
        if (name, field) == ("ClaimResponse", "empty_reason"):
            # A string for the same reason; test_enums_match checks the
            # EmptyReason alias against the enum.
            continue
        assert _literals(hints[attrs[field]]) == set(enum), f"{name}.{field}: enum differs"


def test_enums_match() -> None:
    schemas = _schemas()
    for name, alias in [
        ("RuntimeClass", models.RuntimeClass),
        ("CellState", models.CellState),
        ("Disposition", models.Disposition),
        ("User", models.User),
        ("ExecReason", models.ExecReason),
    ]:
        assert set(typing.get_args(alias)) == set(schemas[name]["enum"]), name
    reasons = schemas["ClaimResponse"]["properties"]["empty_reason"]["enum"]
    assert set(typing.get_args(models.EmptyReason)) == set(reasons)


def test_every_wire_code_has_its_exception() -> None:
    codes = set(_schemas()["ErrorResponse"]["properties"]["code"]["enum"])
    assert codes <= set(sandboxwich.ERRORS)
    assert set(sandboxwich.ERRORS) == codes
    for code, cls in sandboxwich.ERRORS.items():
        assert cls.code == code
        assert issubclass(cls, sandboxwich.APIError)


def test_error_statuses_match_the_document() -> None:
    """Each code's status is one the document lists for it."""
    doc = _doc()
    statuses: dict[str, set[int]] = {}
    for path in doc["paths"].values():
        for op in path.values():
            for status, resp in op.get("responses", {}).items():
                if "$ref" in resp:
                    resp = doc["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
                desc = resp.get("description", "")
                for code in sandboxwich.ERRORS:
                    if code in desc and status.isdigit():
                        statuses.setdefault(code, set()).add(int(status))
    for code, seen in statuses.items():
        cls = sandboxwich.ERRORS[code]
        if code == "invalid_request":
            assert seen >= {422}
            continue
        assert cls.default_status in seen or not seen, f"{code}: {cls.default_status} not in {seen}"
