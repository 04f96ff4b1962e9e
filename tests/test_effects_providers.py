"""The local publishing service and the HTTP adapter, over real loopback HTTP.

Each fault mode is checked at the adapter: what Cairn is told, and what the provider
actually did (its own effect counters), so the protocol above them can be trusted.
"""

from __future__ import annotations

import pytest

from runtime.providers.base import EffectRequest, Outcome
from runtime.providers.http import HttpProvider
from tests.publishing import PublishingService, free_port

REQUEST = EffectRequest(
    action="publish",
    target="blog/why-sky-blue",
    payload={"title": "Why is the sky blue?", "body": "Rayleigh scattering."},
    client_reference="run-1/publish",
)


def adapter(service: PublishingService, **options) -> HttpProvider:  # noqa: ANN003
    return HttpProvider(name="publishing", base_url=service.url, timeout_seconds=1.0, **options)


def test_it_publishes_once_per_key_and_answers_a_repeat_with_the_same_publication(
    publishing_service,  # noqa: ANN001
):
    provider = adapter(publishing_service)
    first = provider.perform(key="k-1", request=REQUEST)
    again = provider.perform(key="k-1", request=REQUEST)
    assert first.outcome == again.outcome == Outcome.CONFIRMED
    assert first.provider_operation_id == again.provider_operation_id
    stats = publishing_service.stats()
    assert stats["publications"] == 1
    assert stats["by_key"] == {"k-1": 1}
    assert stats["perform_requests"] == {"k-1": 2}


def test_it_refuses_a_key_reused_for_a_different_publication(publishing_service):  # noqa: ANN001
    provider = adapter(publishing_service)
    provider.perform(key="k-1", request=REQUEST)
    other = EffectRequest(action="publish", target="blog/other", payload={"title": "Other"})
    refused = provider.perform(key="k-1", request=other)
    assert refused.outcome == Outcome.FAILED
    assert "different publication" in refused.reason
    assert publishing_service.stats()["publications"] == 1


def test_it_looks_a_publication_up_by_key_and_by_client_reference(publishing_service):  # noqa: ANN001
    provider = adapter(publishing_service)
    done = provider.perform(key="k-1", request=REQUEST)
    by_key = provider.lookup(key="k-1")
    by_reference = provider.lookup(key="not-this-key", client_reference="run-1/publish")
    missing = provider.lookup(key="k-2", client_reference="run-2/publish")
    assert by_key.outcome == by_reference.outcome == Outcome.CONFIRMED
    assert by_key.provider_operation_id == by_reference.provider_operation_id
    assert by_key.provider_operation_id == done.provider_operation_id
    assert missing.outcome == Outcome.NOT_FOUND


@pytest.mark.parametrize("fault", ["drop", "timeout"])
def test_an_accepted_request_without_an_answer_is_unknown_and_the_lookup_confirms_it(
    publishing_service,  # noqa: ANN001
    fault: str,
):
    answer = adapter(publishing_service, extra_headers={"X-Fault": fault}).perform(
        key="k-1", request=REQUEST
    )
    assert answer.outcome == Outcome.UNKNOWN
    assert "no answer after sending" in answer.reason
    found = adapter(publishing_service).lookup(key="k-1")
    assert found.outcome == Outcome.CONFIRMED
    assert publishing_service.stats()["by_key"] == {"k-1": 1}


def test_a_failure_before_accepting_is_unknown_to_the_client_but_nothing_was_recorded(
    publishing_service,  # noqa: ANN001
):
    answer = adapter(publishing_service, extra_headers={"X-Fault": "fail"}).perform(
        key="k-1", request=REQUEST
    )
    assert answer.outcome == Outcome.UNKNOWN
    assert "500" in answer.reason
    assert adapter(publishing_service).lookup(key="k-1").outcome == Outcome.NOT_FOUND
    assert publishing_service.stats()["publications"] == 0


def test_an_unreachable_provider_is_reported_as_not_sent():
    provider = HttpProvider(
        name="publishing", base_url=f"http://127.0.0.1:{free_port()}", timeout_seconds=1.0
    )
    sent = provider.perform(key="k-1", request=REQUEST)
    asked = provider.lookup(key="k-1")
    assert sent.outcome == asked.outcome == Outcome.UNAVAILABLE
    assert sent.reason.startswith("not sent")
    assert asked.reason.startswith("could not ask")


def test_a_provider_without_lookup_cannot_tell(publishing_service):  # noqa: ANN001
    adapter(publishing_service).perform(key="k-1", request=REQUEST)
    publishing_service.faults(lookup="nolookup")
    answer = adapter(publishing_service).lookup(key="k-1")
    assert answer.outcome == Outcome.UNKNOWN
    assert "cannot tell" in answer.reason
    no_path = adapter(publishing_service, lookup_path=None, lookup_reference_path=None)
    assert no_path.lookup(key="k-1").outcome == Outcome.UNKNOWN


def test_queued_faults_apply_to_the_next_requests_in_turn(publishing_service):  # noqa: ANN001
    publishing_service.faults("fail", "drop")
    provider = adapter(publishing_service)
    assert provider.perform(key="k-1", request=REQUEST).outcome == Outcome.UNKNOWN  # fail
    assert publishing_service.stats()["publications"] == 0
    assert provider.perform(key="k-1", request=REQUEST).outcome == Outcome.UNKNOWN  # drop
    third = provider.perform(key="k-1", request=REQUEST)
    assert third.outcome == Outcome.CONFIRMED
    assert publishing_service.stats()["by_key"] == {"k-1": 1}


def test_a_restarted_service_keeps_its_publications(publishing_service):  # noqa: ANN001
    first = adapter(publishing_service).perform(key="k-1", request=REQUEST)
    publishing_service.restart()
    again = adapter(publishing_service).perform(key="k-1", request=REQUEST)
    assert again.provider_operation_id == first.provider_operation_id
    assert publishing_service.stats()["publications"] == 1


def test_the_token_is_read_from_its_reference_at_call_time(tmp_path, monkeypatch):  # noqa: ANN001
    monkeypatch.setenv("TEST_PUBLISHING_TOKEN", "s3cret-for-the-service")
    service = PublishingService(tmp_path / "pub.json", token_env="TEST_PUBLISHING_TOKEN").start()
    try:
        monkeypatch.delenv("TEST_PUBLISHING_TOKEN")
        provider = adapter(service, auth_ref="env:TEST_PUBLISHING_TOKEN")
        missing = provider.perform(key="k-1", request=REQUEST)
        assert missing.outcome == Outcome.UNAVAILABLE
        assert "TEST_PUBLISHING_TOKEN is not set" in missing.reason
        assert "s3cret" not in repr(provider)
        monkeypatch.setenv("TEST_PUBLISHING_TOKEN", "s3cret-for-the-service")
        assert provider.perform(key="k-1", request=REQUEST).outcome == Outcome.CONFIRMED
        wrong = adapter(service, auth_ref="env:TEST_OTHER_TOKEN")
        monkeypatch.setenv("TEST_OTHER_TOKEN", "wrong")
        assert wrong.perform(key="k-2", request=REQUEST).outcome == Outcome.FAILED
        assert service.stats()["publications"] == 1
    finally:
        service.stop()
