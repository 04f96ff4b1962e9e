"""Credentials never belong in stored text: the scan every writer runs over an envelope, a
request or result, and each free-text field Cairn stores (a reason, an action, a provider's
id). Below every app (``cairn.*``), so the tenants app's writers use it too.

``find_secret`` scans a JSON value: its JSON text decides the common case in one Hyperscan
pass (no credential), and only a hit pays for the walk that names the path, normalizing
every key and string first (invisible characters removed, NFKC). ``text_secret`` scans
named free-text values; ``free_text_refuse`` raises SecretInEnvelope naming the field.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import unicodedata
from collections.abc import Callable
from typing import Any

import hyperscan
import orjson

from cairn.errors import SecretInEnvelope


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


WITHHELD = "(withheld: the text looked like it held a credential)"


def free_text_screen(values: dict[str, Any], *, refuse: bool) -> dict[str, Any]:
    """``values`` fit to store: a person's or API client's text that looks like a
    credential is refused (``free_text_refuse``, 422: they can say it again without it);
    text Cairn composed itself (a worker's failure, a provider's answer) is stored as
    WITHHELD instead, since no one could be asked again."""
    if refuse:
        free_text_refuse(values)
        return values
    return {
        name: WITHHELD if value and text_secret({name: value}) else value
        for name, value in values.items()
    }


def free_text_refuse(values: dict[str, Any], *, hint: str = "") -> None:
    """Raise SecretInEnvelope (422) naming the first of ``values`` (field name → stored
    text) that looks like a credential. Every writer of a stored free-text field calls it
    before it writes (``tests/test_free_text_fields.py`` enumerates them)."""
    found = text_secret(values)
    if found:
        field, what = found
        raise SecretInEnvelope(
            f"{field} looks like a credential ({what}); it would be stored and shown in the "
            "clear. Say it without the secret" + (f" {hint}" if hint else "") + ".",
            fields={field: what},
        )
