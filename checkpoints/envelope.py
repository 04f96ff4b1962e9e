"""The checkpoint envelope: a versioned JSON record with eight field groups.

The envelope is validated against its JSON Schema when written and when restored, hashed
over its RFC 8785 canonical form, and migrated from older schema versions only through the
explicit functions in ``MIGRATIONS``. It is never a serialized framework object.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable
from typing import Any

import fastjsonschema
import jsonschema
import orjson
import rfc8785

from cairn.credentials import (  # noqa: F401 - the envelope's scan, named where it was
    _find_secret_path,
    credential_key,
    find_secret,
    json_bytes,
    text_secret,
)
from cairn.errors import InvalidEnvelope

SCHEMA_VERSION = 2
SERIALIZER_VERSION = "rfc8785-json-1"
GROUPS = (
    "identity",
    "position",
    "inputs",
    "evidence",
    "side_effects",
    "budgets",
    "control",
    "compatibility",
)
# Groups a writer may supply; the rest are filled in by the commit service.
CLIENT_GROUPS = ("inputs", "evidence", "side_effects", "budgets", "control")

_uuid = {
    "type": "string",
    "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
}
_sha = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_name = {"type": "string", "minLength": 1, "maxLength": 100}
_nullable_str = {"type": ["string", "null"], "maxLength": 500}
_number = {"type": "number", "minimum": 0}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["schema_version", *GROUPS],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "identity": {
            "type": "object",
            "additionalProperties": False,
            "required": [
                "run_id",
                "workflow_type",
                "workflow_version",
                "checkpoint_id",
                "parent_checkpoint_id",
                "sequence",
                "parent_sha256",
            ],
            "properties": {
                "run_id": _uuid,
                "workflow_type": _name,
                "workflow_version": {"type": "string", "minLength": 1, "maxLength": 50},
                "checkpoint_id": _uuid,
                "parent_checkpoint_id": {"anyOf": [_uuid, {"type": "null"}]},
                "sequence": {"type": "integer", "minimum": 1},
                "parent_sha256": {"anyOf": [_sha, {"const": ""}]},
            },
        },
        "position": {
            "type": "object",
            "additionalProperties": False,
            "required": ["state", "step", "transition_version", "pending_action"],
            "properties": {
                "state": _name,
                "step": {"type": "string", "maxLength": 100},
                # The workflow definition's version (a name); 1 in envelopes written
                # before it was recorded.
                "transition_version": {
                    "type": ["integer", "string"],
                    "minimum": 1,
                    "minLength": 1,
                    "maxLength": 50,
                },
                "pending_action": _nullable_str,
            },
        },
        "inputs": {
            "type": "object",
            # Reproducibility: which prompt, policy and model produced the run's work
            # (names and versions, never secrets).
            "properties": {
                "prompt_version": {"type": "string", "maxLength": 100},
                "policy_version": {"type": "string", "maxLength": 100},
                "model": {"type": "string", "maxLength": 200},
            },
        },
        "evidence": {
            "type": "object",
            "additionalProperties": False,
            "required": ["artifacts", "validators"],
            "properties": {
                "artifacts": {
                    "type": "array",
                    "maxItems": 1000,
                    "items": {
                        "type": "object",
                        "required": ["id", "sha256"],
                        "properties": {
                            "id": _uuid,
                            "sha256": _sha,
                            "name": {"type": "string", "maxLength": 100},
                            "kind": {"type": "string", "maxLength": 32},
                        },
                    },
                },
                "validators": {
                    "type": "array",
                    "maxItems": 1000,
                    "items": {
                        "type": "object",
                        "required": ["name", "passed"],
                        "properties": {"name": _name, "passed": {"type": "boolean"}},
                    },
                },
                "tool_results": {"type": "array", "maxItems": 1000},
                "outputs": {"type": "object"},
            },
        },
        "side_effects": {
            "type": "array",
            "maxItems": 1000,
            "items": {
                "type": "object",
                "required": ["idempotency_key", "status"],
                "properties": {
                    "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 200},
                    "action": {"type": "string", "maxLength": 100},
                    "target": {"type": "string", "maxLength": 500},
                    "provider_operation_id": _nullable_str,
                    "status": {"enum": ["reserved", "pending", "confirmed", "failed", "unknown"]},
                },
            },
        },
        "budgets": {
            "type": "object",
            "properties": {
                "attempts_used": {"type": "integer", "minimum": 0},
                "tokens_used": {"type": "integer", "minimum": 0},
                "cost_used": _number,
                "elapsed_seconds": _number,
                "max_attempts": {"type": ["integer", "null"], "minimum": 1},
                "max_tokens": {"type": ["integer", "null"], "minimum": 1},
                "max_cost": {"type": ["number", "null"], "minimum": 0},
                "deadline": {"type": ["string", "null"], "format": "date-time"},
            },
        },
        "control": {
            "type": "object",
            "properties": {
                "approval_request_id": {"anyOf": [_uuid, {"type": "null"}]},
                "actor": _nullable_str,
                "lease_owner": _nullable_str,
                "next_eligible_at": {"type": ["string", "null"]},
                "reason": {"type": ["string", "null"], "maxLength": 2000},
            },
        },
        "compatibility": {
            "type": "object",
            "additionalProperties": False,
            "required": ["envelope_schema_version", "workflow_code_version", "serializer_version"],
            "properties": {
                "envelope_schema_version": {"const": SCHEMA_VERSION},
                "workflow_code_version": {"type": "string", "maxLength": 50},
                "serializer_version": {"type": "string", "maxLength": 50},
            },
        },
    },
}

_validator = jsonschema.Draft202012Validator(SCHEMA)
# The same schema compiled to Python once (the keywords it uses mean the same in draft 7 and
# 2020-12; formats are annotations in both, as for jsonschema): a valid envelope, the common
# case, is checked in microseconds. Only an invalid one pays for jsonschema, which names
# every problem by path. A property test holds the two to the same verdict.
_compiled = fastjsonschema.compile(
    {key: value for key, value in SCHEMA.items() if key != "$schema"}, use_formats=False
)


class EnvelopeInvalid(Exception):
    """The envelope breaks its schema; ``fields`` maps JSON paths to messages."""

    def __init__(self, fields: dict[str, str]):
        self.fields = fields
        super().__init__("; ".join(f"{k}: {v}" for k, v in fields.items()))


class EnvelopeTooNew(Exception):
    pass


class NoMigration(Exception):
    """No explicit migration covers this schema version."""


def validate(envelope: dict[str, Any]) -> None:
    """Raise EnvelopeInvalid (with every problem, by path) unless the envelope is valid."""
    try:
        _compiled(envelope)
        return
    except fastjsonschema.JsonSchemaException:
        pass
    errors = sorted(_validator.iter_errors(envelope), key=lambda e: list(e.absolute_path))
    if errors:
        fields = {}
        for error in errors[:20]:
            path = ".".join(str(p) for p in error.absolute_path) or "envelope"
            fields.setdefault(path, error.message[:300])
        raise EnvelopeInvalid(fields)


class _SlowPath(Exception):
    pass


_SAFE_INT = 2**53 - 1


def _inspect(value: Any) -> bool:
    """Walk a JSON value; True when some float must be rewritten as an integer first.

    Raises _SlowPath where orjson's output could differ from RFC 8785: a key that is not a
    string or sorts differently in UTF-16, an integer outside the IEEE 754 safe range, or a
    float whose ECMAScript form differs from Python's repr.
    """
    kind = type(value)
    if kind is dict:
        for key in value:
            if type(key) is not str or (not key.isascii() and max(key) > "\uffff"):
                raise _SlowPath
        items = value.values()
    elif kind is list or kind is tuple:
        items = value
    else:
        return _inspect_scalar(value)
    rewrite = False
    # Leaves are checked here, not by a call each: most of an envelope is strings.
    for item in items:
        kind = type(item)
        if kind is str or item is None or kind is bool:
            continue
        if kind is int and -_SAFE_INT <= item <= _SAFE_INT:
            continue
        rewrite = _inspect(item) or rewrite
    return rewrite


def _inspect_scalar(value: Any) -> bool:
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return False
    if kind is int:
        if -_SAFE_INT <= value <= _SAFE_INT:
            return False
        raise _SlowPath
    if kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            raise _SlowPath
        if value.is_integer():
            if abs(value) <= _SAFE_INT:
                return True  # ECMAScript prints 1.0 as 1 (exact below 2**53)
            raise _SlowPath
        if 1e-4 <= abs(value) < 1e16:
            return False  # shortest round-trip digits, no exponent: repr and ECMAScript agree
        raise _SlowPath
    raise _SlowPath


def _integral_floats_as_ints(value: Any) -> Any:
    kind = type(value)
    if kind is float:
        return int(value) if value.is_integer() else value
    if kind is dict:
        return {key: _integral_floats_as_ints(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return [_integral_floats_as_ints(item) for item in value]
    return value


MAX_JSON_DEPTH = 64
# From here on ECMAScript (and so RFC 8785) writes a number with an exponent.
_EXPONENT_FORM = 1e21
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def json_problem(value: Any, *, where: str = "the value") -> str | None:
    """Why ``value`` cannot be stored and hashed as Cairn JSON (RFC 8785, I-JSON), in a
    sentence, or None. Walks without recursion, so hostile nesting cannot exhaust the stack.

    Refused: nesting deeper than MAX_JSON_DEPTH, integers outside ±(2**53 - 1), floats that
    are not finite, whole-number floats from 2**53 up to 1e21 (RFC 8785 writes ``1e20`` as
    the integer 100000000000000000000, which every later read would refuse as one; from
    1e21 on it writes ``1e+21``, a float again), strings or keys with a lone UTF-16
    surrogate, and non-JSON types.
    """
    stack: list[tuple[Any, int, str]] = [(value, 1, where)]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"{path} is nested more than {MAX_JSON_DEPTH} levels deep"
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                return f"{path} contains a lone UTF-16 surrogate, which is not text"
        elif isinstance(item, int):
            if not -_SAFE_INT <= item <= _SAFE_INT:
                return (
                    f"{path} is an integer outside ±(2^53 − 1), which JSON cannot carry "
                    "exactly; send it as a string"
                )
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                return f"{path} is not a finite number"
            if item.is_integer() and _SAFE_INT < abs(item) < _EXPONENT_FORM:
                return (
                    f"{path} is a whole number outside ±(2^53 − 1), which JSON cannot carry "
                    "exactly; send it as a string"
                )
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"{path} has a key that is not a string"
                if _LONE_SURROGATE.search(key):
                    return f"{path} has a key with a lone UTF-16 surrogate, which is not text"
                label = f"{path}.{key[:40]}" if len(path) < 200 else path
                stack.append((child, depth + 1, label))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1, f"{path}[{i}]") for i, child in enumerate(item))
        else:
            return f"{path} is a {type(item).__name__}, not a JSON value"
    return None


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical JSON: the bytes every hash in Cairn is computed over.

    orjson (sorted keys, compact, UTF-8) produces exactly the RFC 8785 bytes for the values
    ``_inspect`` admits; anything else goes through the reference implementation
    (``rfc8785``). A property test holds the two equal. Raises InvalidEnvelope (422) for a
    value RFC 8785 cannot represent, with the sentence of ``json_problem``.
    """
    try:
        if _inspect(value):
            value = _integral_floats_as_ints(value)
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (_SlowPath, TypeError, RecursionError):
        problem = json_problem(value)
        if problem:
            raise InvalidEnvelope(f"Not storable as JSON: {problem}.", fields={"": problem})
        return rfc8785.dumps(value)


def sha256_of(envelope: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(envelope)).hexdigest()


# --- Schema migrations ----------------------------------------------------------------------
def _v1_to_v2(old: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 kept a flat ``state``/``step``, a list of artifact ids and ``budget``.

    Schema 2 groups position, carries sha256 with every artifact reference and names the
    budget group ``budgets``.
    """
    new = copy.deepcopy(old)
    new["schema_version"] = 2
    new["position"] = {
        "state": new.pop("state"),
        "step": new.pop("step", ""),
        "transition_version": 1,
        "pending_action": None,
    }
    evidence = new.setdefault("evidence", {})
    evidence["artifacts"] = [
        {
            "id": ref["id"],
            "sha256": ref["sha256"],
            **({"name": ref["name"]} if "name" in ref else {}),
        }
        for ref in evidence.pop("artifact_refs", [])
    ]
    evidence.setdefault("validators", [])
    new["budgets"] = new.pop("budget", {})
    new.setdefault("side_effects", [])
    new.setdefault("control", {})
    compat = new.setdefault("compatibility", {})
    compat["envelope_schema_version"] = 2
    compat.setdefault("workflow_code_version", "")
    compat.setdefault("serializer_version", SERIALIZER_VERSION)
    return new


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


def migrate(envelope: dict[str, Any]) -> dict[str, Any]:
    """Bring an envelope to SCHEMA_VERSION through each explicit migration in turn."""
    version = envelope.get("schema_version")
    if not isinstance(version, int):
        raise NoMigration("the envelope has no integer schema_version")
    if version > SCHEMA_VERSION:
        raise EnvelopeTooNew(
            f"envelope schema {version} is newer than this code understands ({SCHEMA_VERSION})"
        )
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise NoMigration(f"no migration covers envelope schema version {version}")
        envelope = step(envelope)
        version = envelope["schema_version"]
    return envelope
