"""Step history: every attempt of every step that ends in a checkpoint records when it
started, how long it ran in milliseconds, which worker ran it and how it ended; a failed
attempt records its exception's type and its traceback as an encrypted artifact (never in
the clear); an attempt whose worker died before any commit shows as a gap. The run page
shows failed attempts without opening each checkpoint."""

from __future__ import annotations

import pytest

from checkpoints.models import Artifact, ArtifactReference, Checkpoint, Run, RunStatus
from checkpoints.services.artifacts import artifact_content
from runtime import Workflow
from tests.runtime_support import advance, envelope_at, start

pytestmark = pytest.mark.django_db

SECRET_MARKER = "PLAINTEXT-MARKER-7f3a"
failures = {"left": 0}

stumbling = Workflow("stumbling", version="1")


@stumbling.step("fetch", next="done")
def fetch(ctx):  # noqa: ANN001, ANN201
    if failures["left"]:
        failures["left"] -= 1
        raise KeyError(f"missing field {SECRET_MARKER}")
    return {"fetched": True}


stumbling.terminal("done")

pondering = Workflow("pondering", version="1")


@pondering.step("think", next="done")
def think(ctx):  # noqa: ANN001, ANN201
    for round_ in range(2):
        ctx.model.complete(prompt=f"round {round_}: what is a cairn?")
    return {"rounds": 2}


pondering.terminal("done")


@pytest.fixture(autouse=True)
def _reset(settings) -> None:  # noqa: ANN001
    failures["left"] = 0
    settings.CAIRN_RETRY_DELAY_SECONDS = 0


def _attempts(run) -> list[dict]:  # noqa: ANN001
    rows = Checkpoint.objects.filter(run=run, attempt__isnull=False).order_by("sequence")
    return [row.attempt for row in rows]


def test_each_attempt_records_its_number_start_duration_and_worker(acme):
    run = start(acme, "stumbling")
    assert advance(run, owner="worker-a") == "succeeded"
    (attempt,) = _attempts(run)
    assert attempt["number"] == 1 and attempt["step"] == "fetch"
    assert attempt["worker"] == "worker-a"
    assert attempt["outcome"] == "committed"
    assert isinstance(attempt["duration_ms"], int) and attempt["duration_ms"] >= 0
    checkpoint = Checkpoint.objects.get(run=run, attempt__isnull=False)
    assert attempt["started_at"] <= checkpoint.created_at.isoformat()


def test_a_failed_attempt_records_its_exception_and_an_encrypted_traceback(acme):
    failures["left"] = 1
    run = start(acme, "stumbling", budget={"max_attempts": 3})
    assert advance(run, owner="worker-a") == "waiting_retry"
    assert advance(run, owner="worker-b") == "succeeded"
    failed, committed = _attempts(run)
    assert (failed["number"], failed["outcome"], failed["worker"]) == (1, "retry", "worker-a")
    assert failed["step"] == "fetch" and failed["error_type"] == "KeyError"
    assert (committed["number"], committed["outcome"], committed["worker"]) == (
        2,
        "committed",
        "worker-b",
    )
    traceback = failed["traceback"]
    stored = Artifact.objects.get(pk=traceback["id"], tenant=acme)
    assert stored.sha256 == traceback["sha256"]
    text = artifact_content(stored).decode()
    assert text.startswith("Traceback") and "KeyError" in text
    assert SECRET_MARKER in text  # the traceback is kept whole, encrypted
    # Never in the clear: not in the attempt record, nor in any row's plain columns.
    waiting = Checkpoint.objects.get(run=run, sequence=2)
    assert SECRET_MARKER not in str(waiting.attempt)
    # The failed checkpoint names the traceback among its evidence, so retention keeps it.
    names = [a.get("name") for a in envelope_at(run, 2)["evidence"]["artifacts"]]
    assert "traceback:fetch" in names


def test_each_model_call_keeps_its_prompt_and_response_as_artifacts_with_tokens_and_cost(
    acme, bob, client
):
    run = start(acme, "pondering", budget={"max_attempts": 3, "max_tokens": 100000})
    assert advance(run) == "succeeded"
    (attempt,) = _attempts(run)
    calls = attempt["model_calls"]
    assert len(calls) == 2
    run.refresh_from_db()
    assert (
        sum(c["input_tokens"] + c["output_tokens"] for c in calls) == run.budget_used["tokens_used"]
    )
    for round_, call in enumerate(calls):
        prompt = Artifact.objects.get(pk=call["prompt"]["id"], tenant=acme)
        assert artifact_content(prompt).decode() == f"round {round_}: what is a cairn?"
        response = Artifact.objects.get(pk=call["response"]["id"], tenant=acme)
        assert response.sha256 == call["response"]["sha256"] and artifact_content(response)
        assert call["model"] and call["cost"] >= 0
    # Referenced by the checkpoint, so retention keeps them while it is kept.
    checkpoint = Checkpoint.objects.get(run=run, attempt__isnull=False)
    references = ArtifactReference.objects.filter(checkpoint=checkpoint)
    referenced = set(references.values_list("artifact_id", flat=True))
    assert {str(i) for i in referenced} >= {c["prompt"]["id"] for c in calls}
    client.force_login(bob)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert page.count(">prompt<") == 2 and page.count(">response<") == 2


def test_an_attempt_whose_worker_died_before_committing_is_a_gap(acme):
    run = start(acme, "stumbling", budget={"max_attempts": 3})
    run.refresh_from_db()
    # A worker takes the run, charges its attempt and dies before any commit.
    Run.objects.filter(pk=run.pk).update(budget_used={**run.budget_used, "attempts_used": 1})
    run.refresh_from_db()
    assert advance(run, owner="worker-b") == "succeeded"
    (attempt,) = _attempts(run)
    assert attempt["number"] == 2  # attempt 1 has no checkpoint: its worker died


def test_the_run_page_shows_failed_attempts_with_their_durations(acme, bob, client):
    failures["left"] = 2
    run = start(acme, "stumbling", budget={"max_attempts": 5})
    for _ in range(3):
        advance(run)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    client.force_login(bob)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    begins = page.index('id="timeline"')
    timeline = page[begins : page.index("</table>", begins)]
    assert timeline.count('class="error-type">KeyError<') == 2
    assert timeline.count(" ms</td>") == 3  # three attempts, each with its duration
    assert timeline.count(">traceback<") == 2
    assert SECRET_MARKER not in page
