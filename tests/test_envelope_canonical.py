"""Canonical JSON is RFC 8785 to the byte, and the credential scan's fast path finds what
the full walk finds."""

from __future__ import annotations

import json

import rfc8785
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cairn.errors import InvalidEnvelope
from checkpoints.envelope import _find_secret_path, canonical_json, find_secret, json_bytes

keys = st.text(max_size=8) | st.sampled_from(["\U0001f600", "\ue000", "a\U00010000", "é", "Z"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.0, -0.0, 1.0, 1e21, 1e20, 1e-7, 1e-4, 123.456, 5e-324, 2.5e15])
    | st.text(max_size=12)
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=25,
)


def reference(value: object) -> bytes | type[Exception]:
    try:
        return rfc8785.dumps(value)
    except Exception as exc:  # noqa: BLE001 - the kind of refusal is what we compare
        return type(exc)


def ours(value: object) -> bytes | type[Exception]:
    try:
        return canonical_json(value)
    except Exception as exc:  # noqa: BLE001
        return type(exc)


def poisoned(value: object) -> bool:
    """A whole float from 2^53 up to 1e21: RFC 8785 writes it as an integer JSON cannot
    carry exactly, so Cairn refuses it where the reference would write it."""
    if isinstance(value, float):
        return value.is_integer() and 2**53 - 1 < abs(value) < 1e21
    if isinstance(value, dict):
        return any(poisoned(item) for item in value.values())
    if isinstance(value, list):
        return any(poisoned(item) for item in value)
    return False


@settings(max_examples=600, deadline=None)
@given(values)
def test_canonical_json_equals_the_rfc8785_reference(value):
    expected = reference(value)
    if isinstance(expected, bytes) and poisoned(value):
        assert ours(value) is InvalidEnvelope
        # What RFC 8785 wrote would be read back as an integer no writer accepts.
        assert ours(json.loads(expected)) is InvalidEnvelope
    elif isinstance(expected, bytes):
        assert ours(value) == expected
    else:
        # What RFC 8785 cannot represent is refused as a domain error (a 422, never a 500).
        assert ours(value) is InvalidEnvelope, expected


def test_known_canonical_forms():
    assert canonical_json({"b": 1.0, "a": [1e21, 0.5, -0.0, "é\n"]}) == (
        b'{"a":[1e+21,0.5,0,"\xc3\xa9\\n"],"b":1}'
    )
    # UTF-16 order puts U+E000 after U+1F600's surrogates; code point order would not.
    assert canonical_json({"\ue000": 1, "\U0001f600": 2}) == rfc8785.dumps(
        {"\ue000": 1, "\U0001f600": 2}
    )


secretish = st.sampled_from(
    [
        "Authorization:\tBearer abcdefghijklmnopqrstuvwxyz012345",
        "bearer\nabcdefghijklmnopqrstuvwxyz012345",
        "-----BEGIN RSA PRIVATE KEY-----",
        "sk-abcdefghijklmnopqrstuvwxyz",
        "AKIAABCDEFGHIJKLMNOP",
        "postgres://user:hunter2@db/x",
        "env:OPENAI_API_KEY",
        "a plain sentence",
        # The Kelvin sign: IGNORECASE matches it as k, so the scan must fold it too.
        "Account\u212aey=" + "A" * 40,
        "sk-\u200babcdefghijklmnopqrstuvwxyz",
        "\uff53\uff4b-abcdefghijklmnopqrstuvwxyz",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "3f786850e387550fdab836ed7e6dc881de23001b",
        "Basic dXNlcjpwYXNz",
        "basic aGVsbG8=",
        "env:OPENAI_API_KEY",
    ]
)
secret_scalars = secretish | st.text(max_size=10) | st.integers() | st.booleans() | st.none()
secret_values = st.recursive(
    secret_scalars,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "password",
                    "db_password",
                    "apiKey",
                    "note",
                    "Authorization",
                    "x",
                    "max_tokens",
                    "pass\u200bword",
                    "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44",
                    'a"token',
                    "api\\key",
                    "credentials",
                    "secret_ref",
                ]
            ),
            children,
            max_size=3,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(secret_values)
def test_the_fast_scan_finds_exactly_what_the_walk_finds(value):
    assert find_secret(value) == _find_secret_path(value, "envelope")


@settings(max_examples=400, deadline=None)
@given(values)
@example(1e-05)  # found by CI: orjson writes 0.00001 where Python writes 1e-05
@example(1.5e-06)
def test_json_bytes_say_what_the_standard_encoder_says(value):
    # Size limits and the credential scan read these bytes: the same JSON as the standard
    # compact encoding, give or take how a float is spelled: an exponent may be written 1e-7
    # rather than 1e-07, and a float in [1e-5, 1e-4) positionally (0.00001, two bytes more
    # than 1e-05). So at most two bytes a float the standard encoder writes with an exponent.
    try:
        standard = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except ValueError:
        return
    if "NaN" in standard or "Infinity" in standard:
        return  # orjson writes them as null; canonical_json refuses them anyway
    ours = json_bytes(value)
    assert json.loads(ours) == json.loads(standard)
    allowed = 2 * standard.count("e")
    assert abs(len(ours) - len(standard.encode("utf-8", "surrogatepass"))) <= allowed


def test_the_scan_gives_each_thread_its_own_answer():
    # The web server scans in threads; the trigger search's scratch space is per thread.
    import threading

    clean = {"notes": ["a plain sentence about keys and tokens " * 200]}
    dirty = {"notes": ["a plain sentence " * 200, "sk-abcdefghijklmnopqrstuvwxyz"]}
    wrong = []
    start = threading.Barrier(8)

    def scan(value, expected) -> None:  # noqa: ANN001
        start.wait()
        for _ in range(300):
            try:
                if find_secret(value) != expected:
                    wrong.append(value)
            except Exception as exc:  # noqa: BLE001 - a thread's failure is the finding
                wrong.append(exc)

    expected_dirty = ("envelope.notes.1", "OpenAI-style API key")
    threads = [
        threading.Thread(target=scan, args=(dirty, expected_dirty) if i % 2 else (clean, None))
        for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert find_secret(dirty) == expected_dirty and find_secret(clean) is None
    assert wrong == []
