"""CairnSaver with real LangGraph graphs: Cairn history, interrupts, branches, round trips."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import INTERRUPT
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from checkpoints.models import Checkpoint, Run
from checkpoints.services.integrity import run_verify
from checkpoints.services.reads import checkpoint_envelope
from langgraph_store import threads
from langgraph_store.models import LangGraphCheckpoint
from langgraph_store.saver import AsyncCairnSaver, CairnSaver
from langgraph_store.selectors import thread_runs
from tests.langgraph_support import Log, appender, ask, config, interrupt_graph, linear_graph

# LangGraph stores from its own worker threads: they must see committed data.
pytestmark = pytest.mark.django_db(transaction=True)


def envelopes(run: Run) -> list[dict]:
    return [checkpoint_envelope(c) for c in Checkpoint.objects.filter(run=run).order_by("sequence")]


def test_every_put_is_a_cairn_checkpoint_of_the_threads_run(acme):
    saver = CairnSaver(tenant="acme")
    graph = linear_graph(saver)
    assert graph.invoke({"log": []}, config("t1"))["log"] == ["a", "b", "c"]

    [run] = thread_runs(tenant=acme, thread_id="t1")
    assert (run.workflow_type, run.execution, run.status) == ("langgraph", "external", "running")
    history = [t.config["configurable"]["checkpoint_id"] for t in saver.list(config("t1"))]
    recorded = [e["evidence"]["outputs"]["langgraph"]["checkpoint_id"] for e in envelopes(run)[1:]]
    # Genesis, then one Cairn checkpoint per LangGraph put, in the order they were put.
    assert recorded == list(reversed(history))
    assert run_verify(tenant=acme, run_id=run.id)["ok"]


def test_an_interrupt_shows_the_run_as_waiting_until_it_is_resumed(acme):
    saver = CairnSaver(tenant="acme")
    graph = interrupt_graph(saver)
    result = graph.invoke({"log": []}, config("t1"))
    assert result["__interrupt__"][0].value == "May I?"
    [run] = thread_runs(tenant=acme, thread_id="t1")
    assert (run.state, run.status) == ("interrupted", "waiting_approval")
    assert "interrupt()" in run.status_reason

    assert graph.invoke(Command(resume="yes"), config("t1"))["answer"] == "yes"
    run.refresh_from_db()
    assert (run.state, run.status) == ("running", "running")
    assert [e["position"]["state"] for e in envelopes(run)].count("interrupted") == 1


def test_update_state_on_an_older_checkpoint_forks_a_cairn_run(acme):
    saver = CairnSaver(tenant="acme")
    graph = linear_graph(saver)
    graph.invoke({"log": []}, config("t1"))
    [main] = thread_runs(tenant=acme, thread_id="t1")
    after_a = next(s for s in graph.get_state_history(config("t1")) if s.next == ("b",))

    branch = graph.update_state(after_a.config, {"log": ["edited"]})
    assert graph.invoke(None, branch)["log"] == ["a", "edited", "b", "c"]

    main_after, fork = thread_runs(tenant=acme, thread_id="t1")
    assert main_after.version == main.version  # the original history is not touched
    recorded = LangGraphCheckpoint.objects.get(
        thread__thread_id="t1", checkpoint_id=after_a.config["configurable"]["checkpoint_id"]
    )
    assert (fork.forked_from_run_id, fork.forked_from_checkpoint_id) == (
        main.id,
        recorded.cairn_checkpoint_id,
    )
    assert envelopes(fork)[1]["evidence"]["outputs"]["langgraph"]["branch"] is True
    # The thread continues on the branch, and LangGraph still lists both branches.
    assert graph.get_state(config("t1")).values["log"] == ["a", "edited", "b", "c"]
    assert len(list(graph.get_state_history(config("t1")))) == 5 + 3
    assert all(run_verify(tenant=acme, run_id=r.id)["ok"] for r in (main_after, fork))


def subgraph_graph(saver: CairnSaver | InMemorySaver):  # noqa: ANN201
    inner = StateGraph(Log)
    inner.add_node("ask", ask)
    inner.add_edge(START, "ask")
    inner.add_edge("ask", END)
    outer = StateGraph(Log)
    outer.add_node("a", appender("a"))
    outer.add_node("inner", inner.compile())
    outer.add_edge(START, "a")
    outer.add_edge("a", "inner")
    outer.add_edge("inner", END)
    return outer.compile(checkpointer=saver)


def test_a_subgraph_checkpoints_into_its_parents_run_and_can_wait(acme):
    graph = subgraph_graph(CairnSaver(tenant="acme"))
    graph.invoke({"log": []}, config("t1"))
    [run] = thread_runs(tenant=acme, thread_id="t1")
    namespaces = set(LangGraphCheckpoint.objects.values_list("checkpoint_ns", flat=True))
    assert "" in namespaces and any(ns.startswith("inner:") for ns in namespaces)
    assert run.status == "waiting_approval"
    resumed = graph.invoke(Command(resume="ok"), config("t1"))
    assert [r.id for r in thread_runs(tenant=acme, thread_id="t1")] == [run.id]

    # Exactly what LangGraph's own in-memory saver gives for the same graph.
    reference = subgraph_graph(InMemorySaver())
    reference.invoke({"log": []}, config("t1"))
    assert resumed == reference.invoke(Command(resume="ok"), config("t1"))


def test_checkpoints_versions_metadata_and_writes_round_trip_exactly(acme):
    saver = CairnSaver(tenant="acme")
    checkpoint = generate_checkpoint(
        channel_values={"n": 1, "f": 2.5, "s": "x", "raw": b"\x00\x01", "none": None},
        channel_versions={"n": 1, "f": 1.5, "s": "00000000000000000000000000000001.0.5"},
        versions_seen={"node": {"n": 1, "s": "00000000000000000000000000000001.0.5"}},
    )
    checkpoint["channel_versions"].update({"raw": 3, "none": 4})
    parent = {"configurable": {"thread_id": "t1", "checkpoint_ns": "sub:1", "checkpoint_id": "p"}}
    metadata = generate_metadata(source="update", step=7, run_id="r1", score=0.5)
    stored = saver.put(parent, checkpoint, metadata, dict(checkpoint["channel_versions"]))
    saver.put_writes(stored, [("b", {"k": [1, 2]}), ("a", "v")], "task-2", task_path="~b")
    saver.put_writes(stored, [("z", 1), (INTERRUPT, "why?")], "task-1", task_path="~a")

    got = saver.get_tuple(stored)
    assert got.config == stored
    assert got.parent_config == parent
    assert got.checkpoint == checkpoint
    assert got.metadata == metadata
    # LangGraph's write order: (task_path, task_id, idx), special channels by their index.
    assert got.pending_writes == [
        ("task-1", INTERRUPT, "why?"),
        ("task-1", "z", 1),
        ("task-2", "b", {"k": [1, 2]}),
        ("task-2", "a", "v"),
    ]
    assert WRITES_IDX_MAP[INTERRUPT] < 0
    assert threads.INTERRUPT_CHANNEL == INTERRUPT


def test_values_are_sealed_at_rest_and_never_in_the_envelope(acme):
    saver = CairnSaver(tenant="acme")
    secret = "the-launch-code-is-4711"
    checkpoint = generate_checkpoint(channel_values={"note": secret}, channel_versions={"note": 1})
    stored = saver.put(config("t1") | {}, checkpoint, generate_metadata(), {"note": 1})
    saver.put_writes(stored, [("note", secret)], "task")
    with connection.cursor() as cursor:
        for table in ("langgraphcheckpoint", "langgraphblob", "langgraphwrite"):
            cursor.execute(f"SELECT * FROM langgraph_store_{table}")
            assert secret not in repr(cursor.fetchall())
    [run] = thread_runs(tenant=acme, thread_id="t1")
    assert secret not in repr(envelopes(run))
    assert saver.get_tuple(stored).checkpoint["channel_values"] == {"note": secret}


def test_the_async_saver_runs_an_async_graph(acme):
    async def main() -> dict:
        graph = interrupt_graph(AsyncCairnSaver(tenant="acme"))
        try:
            await graph.ainvoke({"log": []}, config("t1"))
            return await graph.ainvoke(Command(resume="async yes"), config("t1"))
        finally:
            await sync_to_async(connections.close_all)()

    assert asyncio.run(main())["answer"] == "async yes"
    [run] = thread_runs(tenant=acme, thread_id="t1")
    assert "interrupted" in [e["position"]["state"] for e in envelopes(run)]


def test_reading_a_checkpoint_takes_the_same_queries_however_many_values_it_has(acme):
    saver = CairnSaver(tenant="acme")

    def put(n: int) -> dict:
        values = {f"c{i}": i for i in range(n)}
        checkpoint = generate_checkpoint(
            channel_values=values, channel_versions=dict.fromkeys(values, 1)
        )
        stored = saver.put(
            config(f"t{n}"), checkpoint, generate_metadata(), dict.fromkeys(values, 1)
        )
        saver.put_writes(stored, [(f"w{i}", i) for i in range(n)], "task")
        return stored

    counts = []
    for n in (1, 20):
        stored = put(n)
        with CaptureQueriesContext(connection) as queries:
            assert len(saver.get_tuple(stored).checkpoint["channel_values"]) == n
        counts.append(len(queries))
    assert counts[0] == counts[1] <= 4
