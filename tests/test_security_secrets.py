"""Secrets by reference: envelopes never hold credentials; references resolve at call time,
``file:`` references only inside CAIRN_SECRETS_DIR."""

from __future__ import annotations

import os

import pytest

from cairn.secrets import SecretUnavailable, secret_resolve
from checkpoints.envelope import find_secret
from checkpoints.models import Checkpoint

# Built from pieces so no scanner mistakes this file for a leak.
FAKE = {
    "OpenAI key": "sk-" + "proj-" + "a1B2c3D4e5F6g7H8i9J0kLmN",
    "Anthropic key": "sk-" + "ant-api03-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3",
    "AWS access key id": "AKIA" + "IOSFODNN7EXAMPLE",
    "GitHub token": "ghp_" + "A" * 36,
    "GitHub fine-grained token": "github_pat_" + "11ABCDEFG0" * 5,
    "GitLab token": "glpat-" + "x1y2z3" * 4,
    "Slack token": "xoxb-" + "1234567890-abcdefghij",
    "Slack webhook": "https://hooks.slack.com/services/" + "T0000/B0000/XXXXXXXX",
    "Google API key": "AIza" + "S" * 35,
    "Stripe secret key": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "Hugging Face token": "hf_" + "abcdefghijklmnopqrstuvwxyz0123456789",
    "npm token": "npm_" + "a" * 36,
    "SendGrid key": "SG." + "a" * 22 + "." + "b" * 43,
    "JSON Web Token": "eyJ" + "hbGciOiJIUzI1NiJ9" + ".eyJ" + "zdWIiOiIxMjM0In0" + "." + "c" * 43,
    "Azure storage key": "DefaultEndpointsProtocol=https;AccountKey=" + "A" * 86 + "==",
    "password in a URL": "postgres://" + "app:s3cr3tpw" + "@db.internal:5432/app",
    "PEM private key": "-----BEGIN " + "RSA PRIVATE KEY-----\nMIIEow...\n",
    "OpenSSH private key": "-----BEGIN " + "OPENSSH PRIVATE KEY-----\nb3Blbn...",
    "PGP private key": "-----BEGIN " + "PGP PRIVATE KEY BLOCK-----\nlQOYBF...",
    "Authorization header": "Authorization: " + "Basic dXNlcjpwYXNz",
    "bearer token": "curl -H 'x: Bearer " + "abcdefghijklmnopqrstuvwxyz012345'",
    "Cairn API token": "cairn_" + "Q" * 43,
    "AWS secret access key": "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY",
    "Basic credentials": "curl -H 'Authorization-ish: " + "Basic dXNlcjpwYXNz'",
    "bare Basic credentials": "Basic " + "YWxpY2U6czNjcjN0",
}


@pytest.mark.parametrize("what", sorted(FAKE))
def test_it_finds_a_credential_pattern_anywhere_in_the_envelope(what):  # noqa: ANN001
    envelope = {"inputs": {"notes": ["fine", {"deep": f"see {FAKE[what]} here"}]}}
    found = find_secret(envelope)
    assert found is not None, what
    assert found[0] == "envelope.inputs.notes.1.deep"


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "db_password",
        "apiKey",
        "api-key",
        "X-API-Key",
        "client_secret",
        "clientSecret",
        "secret_key",
        "access_token",
        "refreshToken",
        "Authorization",
        "private_key",
        "Cookie",
        "token",
        "x_token",
        "pageToken",
        "aws_secret_access_key",
        "AWS_SECRET_ACCESS_KEY",
        "credentials",
        "passphrase",
        "secret_value",
        "webhook_secret",
    ],
)
def test_it_refuses_a_literal_under_a_credential_key_but_takes_a_reference(key):  # noqa: ANN001
    assert find_secret({"headers": {key: "hunter2"}}) == (
        f"envelope.headers.{key}",
        f"a value under the key '{key}'",
    )
    assert find_secret({"headers": {key: "env:UPSTREAM_TOKEN"}}) is None
    assert find_secret({"headers": {key: "file:upstream/token"}}) is None
    assert find_secret({"headers": {key: ""}}) is None


@pytest.mark.parametrize(
    "value",
    [
        {"max_tokens": 4000, "tokens_used": 12, "token_count": "12"},
        {"question": "What is a bearer token and how does basic authorization work?"},
        {"url": "https://example.org/docs?page=2", "sha256": "a" * 64},
        {"api_key_ref": "env:MODEL_API_KEY", "auth_ref": "file:publishing"},
        {"text": "sk-short and ghp_short are not keys"},
        {"email": "reviewer@example.org"},
        {"commit": "3f786850e387550fdab836ed7e6dc881de23001b", "sha1": "a" * 40},
        {"note": "Basic aGVsbG8gd29ybGQ= is just hello world", "basic": "plan"},
        {"tokens": 5, "max_tokens": 1, "secret_ref": "env:X", "primary_key": 7},
        {"idempotency_key": "k-1", "sort_key": "name", "token_count": 12},
        {"password_required": True, "api_key": None, "token": ""},
    ],
)
def test_it_leaves_ordinary_values_alone(value):  # noqa: ANN001
    assert find_secret(value) is None


@pytest.mark.parametrize("what", ["OpenAI key", "PEM private key", "Authorization header"])
def test_a_commit_with_a_credential_is_refused_with_422_and_nothing_written(
    api_as, bob, acme, run, what
):  # noqa: ANN001
    api = api_as(bob, acme)
    response = api.post(
        f"/api/v1/runs/{run.pk}/checkpoints",
        {
            "expected_version": run.version,
            "state": "draft_answer",
            "step": "draft_answer",
            "envelope": {"inputs": {"context": [FAKE[what]]}},
        },
        format="json",
    )
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "secret_in_envelope"
    assert list(body["fields"]) == ["envelope.inputs.context.0"]
    # The refusal names where, never echoes the value.
    assert FAKE[what] not in response.content.decode()
    assert Checkpoint.objects.filter(run=run).count() == 1


def test_a_run_with_a_credential_in_its_inputs_is_refused(api_as, bob, acme, workflow):  # noqa: ANN001
    response = api_as(bob, acme).post(
        "/api/v1/runs",
        {
            "workflow_type": "research",
            "execution": "external",
            "inputs": {"db": FAKE["password in a URL"]},
        },
        format="json",
    )
    assert response.status_code == 422
    assert response.json()["code"] == "secret_in_envelope"


# --- references ---------------------------------------------------------------------------
def test_an_env_reference_reads_the_variable_at_call_time(monkeypatch):  # noqa: ANN001
    monkeypatch.setenv("CAIRN_TEST_SECRET", "first")
    assert secret_resolve("env:CAIRN_TEST_SECRET") == "first"
    monkeypatch.setenv("CAIRN_TEST_SECRET", "rotated")
    assert secret_resolve("env:CAIRN_TEST_SECRET") == "rotated"
    monkeypatch.delenv("CAIRN_TEST_SECRET")
    with pytest.raises(SecretUnavailable, match="CAIRN_TEST_SECRET is not set"):
        secret_resolve("env:CAIRN_TEST_SECRET")


@pytest.fixture
def secrets_dir(tmp_path, settings):  # noqa: ANN001
    base = tmp_path / "secrets"
    (base / "team").mkdir(parents=True)
    (base / "publishing").write_text("pub-token-1\n")
    (base / "team" / "model").write_text("model-key")
    (tmp_path / "outside").write_text("not yours")
    settings.CAIRN_SECRETS_DIR = str(base)
    return base


def test_a_file_reference_reads_under_the_secrets_directory(secrets_dir):  # noqa: ANN001
    assert secret_resolve("file:publishing") == "pub-token-1"
    assert secret_resolve("file:team/model") == "model-key"


@pytest.mark.parametrize(
    "reference",
    ["file:../outside", "file:team/../../outside", "file:/etc/hostname", "file:.", "file:link"],
)
def test_a_file_reference_leading_outside_the_directory_is_refused(secrets_dir, reference):  # noqa: ANN001
    os.symlink(secrets_dir.parent / "outside", secrets_dir / "link")
    with pytest.raises(SecretUnavailable, match="outside CAIRN_SECRETS_DIR") as refused:
        secret_resolve(reference)
    assert "not yours" not in str(refused.value)


def test_file_references_need_the_directory_setting(settings):  # noqa: ANN001
    settings.CAIRN_SECRETS_DIR = ""
    with pytest.raises(SecretUnavailable, match="set CAIRN_SECRETS_DIR"):
        secret_resolve("file:publishing")


@pytest.mark.parametrize("reference", ["", "hunter2", "vault:x", "env:", "file:"])
def test_a_value_that_is_not_a_reference_is_refused_without_echoing_it(reference):  # noqa: ANN001
    with pytest.raises(SecretUnavailable) as refused:
        secret_resolve(reference)
    assert "hunter2" not in str(refused.value)


def test_a_missing_file_names_the_reference_only(secrets_dir):  # noqa: ANN001
    with pytest.raises(SecretUnavailable, match="The secret file nope cannot be read"):
        secret_resolve("file:nope")


def test_one_implementation_serves_the_providers_and_the_runtime():
    from runtime import model_client as models
    from runtime.providers import http

    assert http.secret_resolve is secret_resolve
    assert models.secret_resolve is secret_resolve


# --- values that are not plain strings, and evasions ----------------------------------------
@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"password": ["hunter2"]}, "envelope.password.0"),
        ({"api_key": 123456789012345}, "envelope.api_key"),
        ({"auth": {"credentials": {"user": "u", "pw": "x"}}}, "envelope.auth.credentials.user"),
        ({"token": 4.5}, "envelope.token"),
        ({"config": [{"secret_value": [["deep"]]}]}, "envelope.config.0.secret_value.0.0"),
    ],
)
def test_a_value_under_a_credential_key_is_refused_whatever_its_type(value, path):  # noqa: ANN001
    found = find_secret(value)
    assert found is not None and found[0] == path, found
    assert "under the key" in found[1]


ZERO_WIDTH, SOFT_HYPHEN = "\u200b", "\u00ad"


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


@pytest.mark.parametrize(
    "value",
    [
        {"note": "sk-" + ZERO_WIDTH + "proj-a1B2c3D4e5F6g7H8i9J0kLmN"},
        {"note": _fullwidth(FAKE["OpenAI key"])},
        {"note": _fullwidth(FAKE["AWS access key id"])},
        {"note": "-----BEGIN RSA" + SOFT_HYPHEN + " PRIVATE KEY-----"},
        {"pass" + ZERO_WIDTH + "word": "hunter2"},
        {_fullwidth("password"): "hunter2"},
        {"api" + "\u2060" + "_key": "hunter2"},
    ],
)
def test_zero_width_and_fullwidth_evasions_are_normalized_before_matching(value):  # noqa: ANN001
    assert find_secret(value) is not None, value
