"""An operator downloads a run's signed evidence from the run page in a real browser, and
the offline verifier accepts the file and refuses it after a one-byte change."""

from __future__ import annotations

import pytest

from approvals.signing import evidence_signing_key
from tests.evidence_support import published_run, reviewer, verify_offline

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_downloads_evidence_that_verifies_offline_until_a_byte_changes(
    live_server, page, login, acme, bob, carol, workflow, settings, tmp_path
):  # noqa: ANN001
    settings.CAIRN_EVIDENCE_KEY_FILE = tmp_path / "home" / "evidence_signing_key.pem"
    settings.CAIRN_EVIDENCE_KEY_GENERATE = True
    run = published_run(acme, bob, [carol, reviewer(acme, "dora")])
    login(page, bob)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    with page.expect_download() as download:
        page.get_by_role("link", name="Download signed evidence").click()
    bundle = tmp_path / download.value.suggested_filename
    download.value.save_as(bundle)
    key = tmp_path / "evidence-key.pem"
    key.write_text(evidence_signing_key().public_pem)

    good = verify_offline(bundle, key)
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"VERIFIED: run {run.pk}" in good.stdout

    data = bytearray(bundle.read_bytes())
    data[100] ^= 0x04
    bundle.write_bytes(bytes(data))
    bad = verify_offline(bundle, key)
    assert bad.returncode == 1 and "NOT VERIFIED" in bad.stdout
