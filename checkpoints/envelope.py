"""The checkpoint envelope: a versioned JSON record with eight field groups.

The envelope is validated against its JSON Schema when written and when restored, hashed
over its RFC 8785 canonical form, and migrated from older schema versions only through the
explicit functions in ``MIGRATIONS``. It is never a serialized framework object.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import threading
import unicodedata
from collections.abc import Callable
from typing import Any

import fastjsonschema
import hyperscan
import jsonschema
import orjson
import rfc8785

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


def json_bytes(value: Any) -> bytes:
    """The value's compact JSON as UTF-8 (not ASCII-escaped, keys in their own order): what
    size limits and the credential scan read. orjson writes it; a value orjson refuses (a
    lone surrogate, a non-string key, an integer past 64 bits) falls back to the standard
    encoder, which writes the same bytes for everything orjson accepts."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is one
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8", "surrogatepass")


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


# --- Credentials never belong in an envelope ----------------------------------------------
# What a scan can and cannot catch (docs/security.md): it finds credentials written as
# credentials; a secret split over values, encoded (base64 of a whole config) or described
# in prose passes. That is why envelopes are encrypted anyway, and hold references.


def _basic_credentials(match: re.Match[str]) -> bool:
    """``Basic <base64>`` is credentials when the base64 reads as ``user:password``."""
    try:
        decoded = base64.b64decode(match.group(1) + "==", validate=False).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return False
    return ":" in decoded and decoded.isprintable()


def _aws_secret(match: re.Match[str]) -> bool:
    """A 40-character run of base64 letters is an AWS secret access key when it mixes upper
    case, lower case and digits (a SHA-1 in hex, lower case only, is not)."""
    text = match.group(0)
    return (
        any(c.isupper() for c in text)
        and any(c.islower() for c in text)
        and any(c.isdigit() for c in text)
    )


_SECRET_PATTERNS = [
    ("PEM private key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----")),
    ("Authorization header", re.compile(r"(?i)\b(authorization|proxy-authorization)\s*:\s*\S")),
    ("bearer token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{20,}")),
    ("Basic credentials", re.compile(r"(?i)\bbasic\s+([A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])")),
    ("OpenAI-style API key", re.compile(r"\bsk-[A-Za-z0-9_\-]{20,}")),
    ("AWS access key id", re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")),
    (
        "AWS secret access key",
        re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"),
    ),
    ("GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}")),
    ("GitHub fine-grained token", re.compile(r"\bgithub_pat_[A-Za-z0-9_]{40,}")),
    ("GitLab token", re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}")),
    ("Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("Slack webhook", re.compile(r"hooks\.slack\.com/services/T[A-Za-z0-9]+/B[A-Za-z0-9]+/\w+")),
    ("Google API key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b")),
    ("Stripe secret key", re.compile(r"\b[rs]k_live_[0-9A-Za-z]{16,}")),
    ("Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("npm token", re.compile(r"\bnpm_[A-Za-z0-9]{36}\b")),
    ("SendGrid key", re.compile(r"\bSG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}")),
    (
        "JSON Web Token",
        re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
    ),
    ("Azure storage key", re.compile(r"(?i)\bAccountKey=[A-Za-z0-9+/]{40,}")),
    ("password in a URL", re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^/\s:@]+:[^/\s:@]+@[^\s]")),
    ("Cairn API token", re.compile(r"\bcairn_[A-Za-z0-9_\-]{30,}")),
]
# A match of these patterns is a credential only when its check agrees.
_PATTERN_CHECKS: dict[str, Callable[[re.Match[str]], bool]] = {
    "Basic credentials": _basic_credentials,
    "AWS secret access key": _aws_secret,
}


def _pattern_hit(what: str, pattern: re.Pattern[str], text: str) -> bool:
    check = _PATTERN_CHECKS.get(what)
    if check is None:
        return pattern.search(text) is not None
    return any(check(match) for match in pattern.finditer(text))


# Characters that render as nothing: a credential with one inside still works wherever the
# text is pasted back, so they are removed before matching (and NFKC folds fullwidth and
# other compatibility forms to the letters they show).
_INVISIBLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
    "\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0]"
)


def _normal(text: str) -> str:
    """The text as matching sees it: invisible characters removed, then NFKC."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", _INVISIBLE.sub("", text))


_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_WORDS = re.compile(r"[a-z0-9]+")
# A key whose last word is one of these holds a credential ("password", "db_password",
# "apiKey", "X-API-Key", "client_secret", "id_token", "aws_secret_access_key", "Cookie"…).
_CREDENTIAL_WORDS = frozenset(
    {
        "password", "passwd", "pwd", "pass", "passphrase", "secret", "token", "credential",
        "credentials", "cookie", "authorization", "apikey", "privatekey", "secretkey",
    }
)  # fmt: skip
_KEY_QUALIFIERS = frozenset({"api", "private", "secret", "access", "signing", "encryption"})
_SECRET_HOLDERS = frozenset({"secret", "password", "token"})


def credential_key(name: str) -> bool:
    """Whether a value under the key ``name`` must be a reference (``env:NAME``,
    ``file:NAME``), never a literal. The key is split into words (``apiKey`` is api, key;
    ``X-API-Key`` is x, api, key), after removing invisible characters and NFKC."""
    words = _WORDS.findall(_CAMEL.sub(r"\1_\2", _normal(name)).lower())
    if not words:
        return False
    last = words[-1]
    if last in _CREDENTIAL_WORDS or (len(words) == 1 and last.endswith(("token", "password"))):
        return True
    before = words[-2] if len(words) > 1 else ""
    if last == "key" and (before in _KEY_QUALIFIERS or "secret" in words):
        return True
    # "secret_value", "password_text", "token_string"…
    return last in ("value", "string", "text", "data") and before in _SECRET_HOLDERS


# Literal text (lower case) without which a pattern cannot match: one fast substring test
# spares running the regular expression over the whole envelope. A pattern missing here is
# always run, so adding a pattern can never weaken the scan.
_TRIGGERS: dict[str, tuple[str, ...]] = {
    "PEM private key": ("-----begin",),
    "Authorization header": ("authorization",),
    "bearer token": ("bearer",),
    "Basic credentials": ("basic",),
    "OpenAI-style API key": ("sk-",),
    "AWS access key id": ("akia", "asia"),
    "AWS secret access key": (),  # the expression below finds its candidates
    "GitHub token": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    "GitHub fine-grained token": ("github_pat_",),
    "GitLab token": ("glpat-",),
    "Slack token": ("xox",),
    "Slack webhook": ("hooks.slack.com",),
    "Google API key": ("aiza",),
    "Stripe secret key": ("k_live_",),
    "Hugging Face token": ("hf_",),
    "npm token": ("npm_",),
    "SendGrid key": ("sg.",),
    "JSON Web Token": ("eyj",),
    "Azure storage key": ("accountkey=",),
    "password in a URL": ("://",),
    "Cairn API token": ("cairn_",),
}
# Triggers that are expressions, not literals: 40 base64 letters in a row (one Hyperscan
# match at most). Where there is such a run, ``_aws_candidate`` finds out whether one run is
# exactly 40 long and mixes upper case, lower case and digits, so a hex digest (64 lower-case
# letters and digits) never costs the pattern's run over the text.
_EXPRESSION_TRIGGERS: dict[str, tuple[str, str]] = {
    "AWS secret access key": ("aws-secret-run", r"[A-Za-z0-9/+]{40}"),
}
_BASE64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/+="
# Every base64 letter (and "=") to "a", every other byte to a space: runs become "a"-runs.
_RUNS = bytes(ord("a") if byte in _BASE64 else ord(" ") for byte in range(256))


def _aws_candidate(data: bytes) -> bool:
    """Whether ``data`` has a run of exactly 40 base64 letters (no "=") mixing upper case,
    lower case and digits. Found with bytes.translate and find, at C speed."""
    mask = data.translate(_RUNS)
    start = mask.find(b"a" * 40)
    while start >= 0:
        end = mask.find(b" ", start)
        end = len(mask) if end < 0 else end
        window = data[start:end]
        if (
            end - start == 40
            and b"=" not in window
            and any(65 <= b <= 90 for b in window)
            and any(97 <= b <= 122 for b in window)
            and any(48 <= b <= 57 for b in window)
        ):
            return True
        start = mask.find(b"a" * 40, end)
    return False


_KEY_WORDS = ("pass", "pwd", "secret", "key", "token", "authorization", "cookie", "credential")


class _TriggerSearch:
    """Every trigger and key word, found in one pass over a text, ASCII case-insensitively
    (Hyperscan): searching for each in turn walked a 50 KB envelope thirty times
    (docs/performance.md). A compiled database is shared; each thread scans with a scratch
    space of its own, as Hyperscan requires. ``expressions`` are (name, regular expression)
    triggers matched as written."""

    def __init__(self, words: tuple[str, ...], expressions: tuple[tuple[str, str], ...]) -> None:
        self.words = words + tuple(name for name, _ in expressions)
        literal = hyperscan.HS_FLAG_CASELESS | hyperscan.HS_FLAG_SINGLEMATCH
        self.database = hyperscan.Database()
        self.database.compile(
            expressions=[re.escape(word).encode("ascii") for word in words]
            + [expression.encode("ascii") for _, expression in expressions],
            ids=list(range(len(self.words))),
            elements=len(self.words),
            flags=[literal] * len(words) + [hyperscan.HS_FLAG_SINGLEMATCH] * len(expressions),
        )
        self._local = threading.local()

    def found(self, data: bytes) -> set[str]:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = hyperscan.Scratch(self.database)
        hits: set[str] = set()

        def on_match(index: int, _start: int, _end: int, _flags: int, _context: object) -> None:
            hits.add(self.words[index])

        self.database.scan(data, match_event_handler=on_match, scratch=scratch)
        return hits


_TRIGGER_SEARCH = _TriggerSearch(
    tuple(sorted({t for ts in _TRIGGERS.values() for t in ts} | set(_KEY_WORDS))),
    tuple(_EXPRESSION_TRIGGERS.values()),
)
# After a key word inside a JSON key: the rest of the key, its closing quote and colon, and
# a value that is not a reference, an empty string, null or a boolean. Tried only where a
# key word occurs (found with str.find: a case-insensitive alternation tried at every
# position of the text cost milliseconds at 50 KB).
_REST_OF_KEY = re.compile(
    r'(?:[^"\\]|\\.){0,200}?"\s*:\s*(?!"(?:env|file):|""|null\b|true\b|false\b)'
)
# JSON escapes whitespace inside strings; put it back so \s in the patterns still matches.
_WHITESPACE_ESCAPES = (
    ("\\n", "\n"),
    ("\\t", "\t"),
    ("\\r", "\r"),
    ("\\f", "\f"),
    ("\\u000b", "\v"),
)


def _triggered(data: bytes) -> tuple[list[tuple[str, re.Pattern[str]]], bool]:
    """The patterns whose triggers occur in the JSON text ``data`` (and those without
    triggers), and whether a credential key word does. Case-insensitive, in one pass."""
    original = data
    if not data.isascii():
        # str.lower folds a few non-ASCII letters to ASCII ones (the Kelvin sign to k), as
        # the patterns' IGNORECASE matching does; an ASCII-caseless search would not.
        data = data.decode("utf-8", "surrogatepass").lower().encode("utf-8", "surrogatepass")
    found = _TRIGGER_SEARCH.found(data)
    if _EXPRESSION_TRIGGERS["AWS secret access key"][0] in found and _aws_candidate(original):
        found.add("AWS secret access key")
    patterns = [
        (what, pattern)
        for what, pattern in _SECRET_PATTERNS
        if what not in _TRIGGERS or not found.isdisjoint(_TRIGGERS[what]) or what in found
    ]
    return patterns, not found.isdisjoint(_KEY_WORDS)


def _credential_key_in_json(plain: str) -> bool:
    lowered = plain.lower()
    if len(lowered) != len(plain):
        return True  # lowering moved the offsets: let the walk decide
    for word in _KEY_WORDS:
        at = lowered.find(word)
        while at >= 0:
            after = at + len(word)
            rest = _REST_OF_KEY.match(plain, after)
            if rest is not None:
                opening = _opening_quote(plain, at)
                closing = _closing_quote(plain, after)
                if opening < 0 or closing < 0:
                    return True  # undecidable here: let the walk decide
                key = plain[opening + 1 : closing]
                if "\\" in key:
                    try:
                        key = json.loads(f'"{key}"')
                    except ValueError:
                        return True
                if credential_key(key):
                    return True
            at = lowered.find(word, after)
    return False


def _escaped(text: str, index: int) -> bool:
    backslashes = 0
    while index - backslashes - 1 >= 0 and text[index - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def _opening_quote(text: str, before: int) -> int:
    index = text.rfind('"', 0, before)
    while index > 0 and _escaped(text, index):
        index = text.rfind('"', 0, index)
    return index


def _closing_quote(text: str, after: int) -> int:
    index = text.find('"', after)
    while index > 0 and _escaped(text, index):
        index = text.find('"', index + 1)
    return index


def _changed_by_normalizing(plain: str) -> bool:
    try:
        return bool(_INVISIBLE.search(plain)) or not unicodedata.is_normalized("NFKC", plain)
    except (UnicodeError, ValueError):
        return True


def find_secret(
    value: Any, path: str = "envelope", *, text: bytes | None = None
) -> tuple[str, str] | None:
    """Return (path, what) of the first value that looks like a credential, else None.

    A scan of the value's JSON text decides the common case (no credential); only a hit
    pays for the walk that names the path. A property test holds the two equal. A caller
    that already has the value's JSON (``json_bytes``) passes it as ``text``. Text that
    normalizing would change (invisible characters, fullwidth letters) is walked at once:
    the walk normalizes each key and string before matching.
    """
    data = json_bytes(value) if text is None else text
    if not data.isascii() and _changed_by_normalizing(data.decode("utf-8", "surrogatepass")):
        return _find_secret_path(value, path)
    patterns, key_word = _triggered(data)
    if not patterns and not key_word:
        return None
    # Triggers hold no whitespace, so every trigger in the unescaped text is in the escaped
    # one: decoding and unescaping only where a trigger hit loses nothing.
    plain = data.decode("utf-8", "surrogatepass")
    for escaped, unescaped in _WHITESPACE_ESCAPES:
        plain = plain.replace(escaped, unescaped)
    suspicious = any(_pattern_hit(what, pattern, plain) for what, pattern in patterns) or (
        key_word and _credential_key_in_json(plain)
    )
    return _find_secret_path(value, path) if suspicious else None


def _find_secret_path(value: Any, path: str, under: str | None = None) -> tuple[str, str] | None:
    """The walk: every key and string normalized, every value under a credential key (a
    string, a number, or either inside a list or object there) that is not a reference."""
    if isinstance(value, dict):
        for key, item in value.items():
            name = str(key)
            found = _find_secret_path(
                item, f"{path}.{key}", under or (name if credential_key(name) else None)
            )
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _find_secret_path(item, f"{path}.{index}", under)
            if found:
                return found
    elif isinstance(value, str):
        if under is not None and value and not value.startswith(("env:", "file:")):
            return path, f"a value under the key '{under}'"
        normal = _normal(value)
        for what, pattern in _SECRET_PATTERNS:
            if _pattern_hit(what, pattern, normal):
                return path, what
    elif under is not None and isinstance(value, int | float) and not isinstance(value, bool):
        return path, f"a value under the key '{under}'"
    return None


def text_secret(values: dict[str, Any]) -> tuple[str, str] | None:
    """The first of several named free-text values (a reason, an action name, a provider's
    id) that looks like a credential: (name, what), or None. Every stored free-text field
    goes through here (``cairn.errors.SecretInEnvelope`` names the field)."""
    found = find_secret({k: v for k, v in values.items() if v}, path="")
    return (found[0].removeprefix("."), found[1]) if found else None


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
