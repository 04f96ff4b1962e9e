"""Signed evidence (issue 27, item 5): GET /api/v1/runs/{id}/evidence, the published public
key, the offline verifier run as a real process, and single-byte tampering."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st
from rest_framework.test import APIClient

from approvals import evidence_verify
from approvals.evidence_verify import canonical, load_public_key, verify
from approvals.signing import evidence_signing_key
from tenants.models import AuditEvent
from tests.evidence_support import bundle_of, published_run, rejected_run, reviewer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _own_key(settings, tmp_path):  # noqa: ANN001
    """Each test signs with a key generated under its own home (the embedded default)."""
    settings.CAIRN_EVIDENCE_KEY_FILE = tmp_path / "home" / "evidence_signing_key.pem"
    settings.CAIRN_EVIDENCE_KEY_GENERATE = True


@pytest.fixture
def dora(acme):  # noqa: ANN001
    return reviewer(acme, "dora")


@pytest.fixture
def published(acme, bob, carol, dora, workflow):  # noqa: ANN001
    return published_run(acme, bob, [carol, dora])


def public_key():  # noqa: ANN201
    return load_public_key(evidence_signing_key().public_pem)


def resigned(data: bytes, change) -> bytes:  # noqa: ANN001
    """The bundle with its payload changed by ``change`` and signed again with the
    deployment's key: what a deployment whose rows were altered would export."""
    document = json.loads(data)
    change(document["payload"])
    document["signature"]["value"] = evidence_signing_key().sign(canonical(document["payload"]))
    return canonical(document)


# --- the API -------------------------------------------------------------------------------
def test_an_operator_downloads_a_bundle_that_verifies_under_the_published_key(
    published, bob, api_as
):  # noqa: ANN001
    response = api_as(bob, published.tenant).get(f"/api/v1/runs/{published.id}/evidence")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"].startswith('attachment; filename="cairn-evidence-')
    published_key = APIClient().get("/api/v1/evidence/public-key")
    assert published_key.status_code == 200
    assert published_key.json()["algorithm"] == "Ed25519"
    key = load_public_key(json.dumps(published_key.json()))
    assert verify(response.content, key) == []
    payload = json.loads(response.content)["payload"]
    assert payload["key_id"] == published_key.json()["key_id"] == response["X-Evidence-Key-Id"]
    assert [c["sequence"] for c in payload["checkpoints"]] == [1, 2, 3, 4, 5, 6]
    assert all(
        later["parent_sha256"] == earlier["sha256"]
        for earlier, later in zip(payload["checkpoints"], payload["checkpoints"][1:], strict=False)
    )
    (approval,) = payload["approvals"]
    assert approval["status"] == "consumed" and approval["verdict"] == "used"
    assert approval["required_approvals"] == 2
    assert sorted(d["reviewer"] for d in approval["decisions"]) == ["carol", "dora"]
    assert {d["artifact_sha256"] for d in approval["decisions"]} == {approval["artifact_sha256"]}
    (operation,) = payload["operations"]
    assert operation["provider_operation_id"] == "post-42"
    assert operation["status"] == "confirmed"
    assert approval["artifact_sha256"] in {a["sha256"] for a in payload["artifacts"]}
    assert payload["server_check"] == {"ok": True, "problems": []}


def test_the_export_is_audited_with_the_bundles_hash(published, bob, api_as):  # noqa: ANN001
    import hashlib

    response = api_as(bob, published.tenant).get(f"/api/v1/runs/{published.id}/evidence")
    event = AuditEvent.objects.get(action="evidence.export", run_id=published.id)
    assert event.actor_label == "bob"
    assert event.details["sha256"] == hashlib.sha256(response.content).hexdigest()
    assert event.details["key_id"] == response["X-Evidence-Key-Id"]


def test_artifact_bytes_are_included_on_request_and_each_read_is_audited(published, bob, api_as):  # noqa: ANN001
    import base64
    import hashlib

    response = api_as(bob, published.tenant).get(
        f"/api/v1/runs/{published.id}/evidence?include=bytes"
    )
    assert response.status_code == 200
    for artifact in json.loads(response.content)["payload"]["artifacts"]:
        content = base64.b64decode(artifact["content_base64"])
        assert hashlib.sha256(content).hexdigest() == artifact["sha256"]
    assert AuditEvent.objects.filter(action="artifact.read", run_id=published.id).exists()
    assert verify(response.content, public_key()) == []


def test_an_unknown_include_is_a_400_with_a_sentence(published, bob, api_as):  # noqa: ANN001
    response = api_as(bob, published.tenant).get(
        f"/api/v1/runs/{published.id}/evidence?include=everything"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert "bytes" in response.json()["detail"]


def test_another_tenants_run_is_a_404_and_nothing_is_audited(published, charlie, globex, api_as):  # noqa: ANN001
    response = api_as(charlie, globex).get(f"/api/v1/runs/{published.id}/evidence")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert not AuditEvent.objects.filter(action="evidence.export").exists()


def test_a_reviewer_may_not_export_evidence(published, carol, api_as):  # noqa: ANN001
    response = api_as(carol, published.tenant).get(f"/api/v1/runs/{published.id}/evidence")
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    assert not AuditEvent.objects.filter(action="evidence.export").exists()


def test_without_credentials_the_bundle_is_a_401(published):  # noqa: ANN001
    response = APIClient().get(f"/api/v1/runs/{published.id}/evidence")
    assert response.status_code == 401


def test_the_openapi_document_describes_both_routes(db):  # noqa: ANN001
    document = APIClient().get("/api/v1/schema?format=json").json()
    evidence = document["paths"]["/api/v1/runs/{run_id}/evidence"]["get"]
    assert {"200", "403", "404", "503"} <= set(evidence["responses"])
    public = document["paths"]["/api/v1/evidence/public-key"]["get"]
    assert "200" in public["responses"]


# --- the key -------------------------------------------------------------------------------
def test_the_embedded_default_generates_the_key_once_readable_only_by_its_owner(settings, tmp_path):  # noqa: ANN001
    path = tmp_path / "fresh" / "evidence_signing_key.pem"
    settings.CAIRN_EVIDENCE_KEY_FILE = path
    first = evidence_signing_key()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert evidence_signing_key().key_id == first.key_id


def test_a_configured_key_file_that_is_missing_is_a_503_never_a_new_key(
    published, bob, api_as, settings, tmp_path
):  # noqa: ANN001
    settings.CAIRN_EVIDENCE_KEY_FILE = tmp_path / "mounted" / "missing.pem"
    settings.CAIRN_EVIDENCE_KEY_GENERATE = False
    response = api_as(bob, published.tenant).get(f"/api/v1/runs/{published.id}/evidence")
    assert response.status_code == 503
    assert response.json()["code"] == "key_unavailable"
    assert "evidence_key --create" in response.json()["detail"]
    assert not (tmp_path / "mounted" / "missing.pem").exists()


def test_the_evidence_key_command_creates_a_configured_key_and_prints_the_public_half(
    settings, tmp_path, capsys
):  # noqa: ANN001
    path = tmp_path / "mounted" / "evidence.pem"
    settings.CAIRN_EVIDENCE_KEY_FILE = path
    settings.CAIRN_EVIDENCE_KEY_GENERATE = False
    call_command("evidence_key", "--create")
    out = capsys.readouterr().out
    assert path.exists() and "BEGIN PUBLIC KEY" in out
    assert f"key id {evidence_signing_key().key_id}" in out


# --- the offline verifier, as a real process --------------------------------------------------
def _write(tmp_path: Path, data: bytes) -> tuple[Path, Path]:
    bundle = tmp_path / "bundle.json"
    bundle.write_bytes(data)
    key = tmp_path / "evidence-key.pem"
    key.write_text(evidence_signing_key().public_pem)
    return bundle, key


def test_the_verifier_copied_alone_verifies_a_bundle_and_refuses_a_changed_byte(
    published, alice, tmp_path
):  # noqa: ANN001
    data = bundle_of(published, alice)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(ROOT / "approvals" / "evidence_verify.py", alone / "evidence_verify.py")
    bundle, key = _write(tmp_path, data)
    # Nothing of Cairn on the path: only the copied module and the interpreter's packages.
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    environment.pop("DJANGO_SETTINGS_MODULE", None)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "evidence_verify", *args],
            cwd=alone,
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
        )

    good = run(str(bundle), "--public-key", str(key))
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.startswith(f"VERIFIED: run {published.id}")
    changed = bytearray(data)
    changed[len(changed) // 2] ^= 0x01
    bundle.write_bytes(bytes(changed))
    bad = run(str(bundle), "--public-key", str(key))
    assert bad.returncode == 1
    assert bad.stdout.startswith("NOT VERIFIED")
    missing = run(str(tmp_path / "nowhere.json"), "--public-key", str(key))
    assert missing.returncode == 2 and "cannot verify" in missing.stderr


def test_the_verifier_runs_from_the_repository_as_documented(published, alice, tmp_path):  # noqa: ANN001
    bundle, key = _write(tmp_path, bundle_of(published, alice))
    done = subprocess.run(
        [sys.executable, "-m", "approvals.evidence_verify", str(bundle), "--public-key", str(key)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_another_deployments_key_is_refused_by_name(published, alice, tmp_path, settings):  # noqa: ANN001
    data = bundle_of(published, alice)
    settings.CAIRN_EVIDENCE_KEY_FILE = tmp_path / "other" / "key.pem"
    (problem,) = verify(data, public_key())
    assert "signed with key" in problem


# --- what the verifier checks beyond the signature -------------------------------------------
def test_an_effect_that_shipped_another_artifact_than_the_approved_one_is_named(published, alice):  # noqa: ANN001
    def swap(payload: dict) -> None:
        sequence = payload["operations"][0]["checkpoint_sequence"]
        link = next(c for c in payload["checkpoints"] if c["sequence"] == sequence)
        link["artifacts"] = {"e" * 64: "draft"}

    problems = verify(resigned(bundle_of(published, alice), swap), public_key())
    assert any("not the approved artifact" in p for p in problems)


def test_a_quorum_short_of_its_reviewers_is_named(published, alice):  # noqa: ANN001
    def drop(payload: dict) -> None:
        payload["approvals"][0]["decisions"].pop()

    problems = verify(resigned(bundle_of(published, alice), drop), public_key())
    assert any("needs 2 approvals by distinct reviewers and has 1" in p for p in problems)


def test_a_broken_chain_is_named(published, alice):  # noqa: ANN001
    def cut(payload: dict) -> None:
        payload["checkpoints"][2]["parent_sha256"] = "0" * 64

    problems = verify(resigned(bundle_of(published, alice), cut), public_key())
    assert any("checkpoint 3 names parent" in p for p in problems)


def test_passing_the_approval_state_without_a_used_approval_is_named(published, alice):  # noqa: ANN001
    def unconsume(payload: dict) -> None:
        payload["approvals"][0]["status"] = "approved"

    problems = verify(resigned(bundle_of(published, alice), unconsume), public_key())
    assert any("enters 'publish', past the approval state 'review'" in p for p in problems)
    assert any("without an approval the run passed it under" in p for p in problems)


def test_a_rejected_run_verifies(acme, alice, bob, carol, workflow):  # noqa: ANN001
    run = rejected_run(acme, bob, carol)
    data = bundle_of(run, alice)
    assert verify(data, public_key()) == []
    (approval,) = json.loads(data)["payload"]["approvals"]
    assert approval["status"] == "rejected"
    assert approval["decisions"][0]["comment"] == "Not sourced."


# --- single-byte tampering --------------------------------------------------------------------
def _every_position_rejected(data: bytes, key, flips: tuple[int, ...]) -> list[int]:  # noqa: ANN001
    accepted = []
    for position in range(len(data)):
        for flip in flips:
            changed = bytearray(data)
            changed[position] ^= flip
            if not verify(bytes(changed), key):
                accepted.append(position)
    return accepted


def test_every_single_byte_change_of_generated_bundles_is_rejected(
    acme, alice, bob, carol, dora, workflow
):  # noqa: ANN001
    """Every position of each bundle, changed three ways (low bit, case bit, high bit), and
    any byte value at any position of bundles whose reviewer comments Hypothesis writes."""
    key = public_key()
    bundles = [
        bundle_of(published_run(acme, bob, [carol]), alice),
        # Non-ASCII text is shipped as \u escapes, whose hex digits' case JSON ignores: only
        # the canonical form catches a changed case there.
        bundle_of(
            published_run(
                acme, bob, [carol, dora], text="second draft\n", comment="Geprüft — gut ✓"
            ),
            alice,
        ),
        bundle_of(rejected_run(acme, bob, carol), alice),
    ]
    for data in bundles:
        assert verify(data, key) == []
        assert _every_position_rejected(data, key, (0x01, 0x20, 0x80)) == []

    runs = iter(range(1000))

    @examples(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        comment=st.text(max_size=40).filter(lambda c: "\x00" not in c),
        where=st.floats(min_value=0, max_value=1, exclude_max=True),
        value=st.integers(min_value=0, max_value=255),
    )
    def tampered(comment: str, where: float, value: int) -> None:
        text = f"draft {next(runs)}\n"
        data = bundle_of(published_run(acme, bob, [carol], text=text, comment=comment), alice)
        assert verify(data, key) == []
        position = int(where * len(data))
        if data[position] == value:
            value ^= 0xFF
        changed = bytearray(data)
        changed[position] = value
        assert verify(bytes(changed), key) != []

    tampered()


def test_the_verifiers_module_imports_nothing_of_cairn():
    source = (ROOT / "approvals" / "evidence_verify.py").read_text()
    imports = [
        line.split()[1]
        for line in source.splitlines()
        if line.startswith(("import ", "from ")) or line.strip().startswith("from cryptography")
    ]
    allowed = {"__future__", "argparse", "base64", "binascii", "difflib", "hashlib", "json", "sys",
               "typing"}  # fmt: skip
    assert {name.split(".")[0] for name in imports} <= allowed | {"cryptography"}
    assert evidence_verify.FORMAT == "cairn-evidence/1"


# --- the console ---------------------------------------------------------------------------
def _console(user):  # noqa: ANN001, ANN202
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def test_the_run_page_offers_the_download_and_it_is_the_signed_bundle(published, bob):  # noqa: ANN001
    from django.urls import reverse

    client = _console(bob)
    page = client.get(reverse("console:run_detail", args=[published.pk])).content.decode()
    url = reverse("console:evidence_download", args=[published.pk])
    assert f'href="{url}" class="button" id="run-evidence-download" download' in page
    response = client.get(url)
    assert response.status_code == 200
    assert response["Content-Disposition"].startswith('attachment; filename="cairn-evidence-')
    assert verify(response.content, public_key()) == []
    event = AuditEvent.objects.get(action="evidence.export", run_id=published.id)
    assert event.actor_label == "bob"


def test_the_console_download_is_refused_to_a_reviewer_and_another_tenant(
    published, carol, charlie
):  # noqa: ANN001
    from django.urls import reverse

    url = reverse("console:evidence_download", args=[published.pk])
    assert _console(carol).get(url).status_code == 403
    assert _console(charlie).get(url).status_code == 404
    assert not AuditEvent.objects.filter(action="evidence.export").exists()


def test_the_console_download_without_a_key_says_why(published, bob, settings, tmp_path):  # noqa: ANN001
    from django.urls import reverse

    settings.CAIRN_EVIDENCE_KEY_FILE = tmp_path / "mounted" / "missing.pem"
    settings.CAIRN_EVIDENCE_KEY_GENERATE = False
    response = _console(bob).get(reverse("console:evidence_download", args=[published.pk]))
    assert response.status_code == 503
    assert b"evidence_key --create" in response.content
