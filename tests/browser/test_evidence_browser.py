"""An operator downloads a run's signed evidence from the run page in a real browser, and
the offline verifier accepts the file and refuses it after a one-byte change."""

from __future__ import annotations

import pytest

from tests.evidence_support import evidence_downloaded_and_checked, published_run, reviewer

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_downloads_evidence_that_verifies_offline_until_a_byte_changes(
    live_server, page, login, acme, bob, carol, workflow, settings, tmp_path
):  # noqa: ANN001
    settings.CAIRN_EVIDENCE_KEY_FILE = tmp_path / "home" / "evidence_signing_key.pem"
    settings.CAIRN_EVIDENCE_KEY_GENERATE = True
    run = published_run(acme, bob, [carol, reviewer(acme, "dora")])
    login(page, bob)
    evidence_downloaded_and_checked(page, f"{live_server.url}/runs/{run.pk}/", tmp_path, run.pk)
