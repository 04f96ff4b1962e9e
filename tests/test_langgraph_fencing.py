"""Fencing: a saver that writes a thread another writer advanced since its last read is
refused, and nothing is written."""

from __future__ import annotations

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

from cairn.errors import ConcurrentCheckpointWrite, RunNotActive
from checkpoints.models import Checkpoint
from langgraph_store.models import LangGraphCheckpoint
from langgraph_store.saver import CairnSaver
from langgraph_store.selectors import thread_head_run
from runtime.services.cancel import run_cancel
from tenants.services import Actor

pytestmark = pytest.mark.django_db(transaction=True)

THREAD = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}


def put(saver: CairnSaver, parent: dict, step: int) -> dict:
    return saver.put(parent, generate_checkpoint(), generate_metadata(step=step), {})


def stored(acme) -> tuple[int, int, int]:  # noqa: ANN001
    run = thread_head_run(tenant=acme, thread_id="t1")
    return (
        LangGraphCheckpoint.objects.count(),
        Checkpoint.objects.filter(run=run).count(),
        run.version,
    )


@pytest.fixture
def head(acme):  # noqa: ANN001
    return put(CairnSaver(tenant="acme"), THREAD, 0)


def test_the_stale_saver_is_refused_and_writes_nothing(acme, head):
    first = CairnSaver(tenant="acme", fencing=True)
    second = CairnSaver(tenant="acme", fencing=True)
    assert first.get_tuple(THREAD) is not None
    assert second.get_tuple(THREAD) is not None

    advanced = put(first, head, 1)
    before = stored(acme)
    with pytest.raises(ConcurrentCheckpointWrite, match="Another writer advanced"):
        put(second, head, 1)
    assert stored(acme) == before
    assert first.get_tuple(THREAD).config == advanced

    # Having read the thread again, the second saver decides on what is there now.
    assert second.get_tuple(THREAD).config == advanced
    put(second, advanced, 2)
    assert stored(acme)[0] == before[0] + 1


def test_a_saver_keeps_writing_after_its_own_writes(acme, head):
    saver = CairnSaver(tenant="acme", fencing=True)
    saver.get_tuple(THREAD)
    config = head
    for step in range(1, 4):
        config = put(saver, config, step)
        saver.put_writes(config, [("__interrupt__", "wait")], "task")
    assert saver.get_tuple(THREAD).config == config


def test_another_writers_interrupt_counts_as_an_advance(acme, head):
    fenced = CairnSaver(tenant="acme", fencing=True)
    fenced.get_tuple(THREAD)
    CairnSaver(tenant="acme").put_writes(head, [("__interrupt__", "stop")], "task")
    with pytest.raises(ConcurrentCheckpointWrite):
        put(fenced, head, 1)


def test_a_fencing_saver_that_never_read_the_thread_is_refused(acme, head):
    with pytest.raises(ConcurrentCheckpointWrite, match="has not read"):
        put(CairnSaver(tenant="acme", fencing=True), head, 1)


def test_without_fencing_the_later_writer_is_accepted(acme, head):
    first, second = CairnSaver(tenant="acme"), CairnSaver(tenant="acme")
    first.get_tuple(THREAD)
    second.get_tuple(THREAD)
    put(first, head, 1)
    put(second, head, 1)  # a sibling of the first one's checkpoint: LangGraph branches
    assert LangGraphCheckpoint.objects.count() == 3


def test_an_operator_cancel_in_cairn_stops_the_graphs_writes(acme, head, bob):
    saver = CairnSaver(tenant="acme")
    latest = put(saver, head, 1)
    run = thread_head_run(tenant=acme, thread_id="t1")
    run_cancel(tenant=acme, run_id=run.id, reason="runaway agent", actor=Actor(user=bob))
    with pytest.raises(RunNotActive):
        put(saver, latest, 2)
    # Nor can the thread go on from an older checkpoint of the cancelled run.
    with pytest.raises(RunNotActive, match="cannot branch"):
        put(saver, head, 2)
