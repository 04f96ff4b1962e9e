"""Deleting, pruning and copying LangGraph threads; what the saver refuses to store."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Annotated, TypedDict

import pytest
from django.db import connection, transaction
from django.utils import timezone
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph

from cairn.errors import IntegrityFailure, InvalidRequest, LegalHoldActive
from checkpoints.crypto import new_key_spec
from checkpoints.models import Checkpoint, Run
from checkpoints.services.integrity import run_verify
from langgraph_store import payloads, services
from langgraph_store.keys import langgraph_keys_rotate
from langgraph_store.models import (
    LangGraphBlob,
    LangGraphCheckpoint,
    LangGraphThread,
    LangGraphWrite,
)
from langgraph_store.saver import CairnSaver
from langgraph_store.selectors import thread_runs
from retention.policies import PolicyInput, legal_hold_set, retention_policy_save
from retention.services import retention_apply, retention_preview
from tenants.models import AuditEvent, Tenant
from tenants.services import Actor

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent


def config(thread: str) -> dict:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def chain(saver: CairnSaver, thread: str, n: int, **metadata) -> list[dict]:  # noqa: ANN003
    """n checkpoints in a row, each with a new value of channel "v" and one pending write."""
    configs, parent = [], config(thread)
    for step in range(n):
        checkpoint = generate_checkpoint(channel_values={"v": step}, channel_versions={"v": step})
        parent = saver.put(
            parent, checkpoint, generate_metadata(step=step, **metadata), {"v": step}
        )
        saver.put_writes(parent, [("v", step + 1)], f"task-{step}")
        configs.append(parent)
    return configs


def test_delete_thread_erases_its_runs_and_their_checkpoints(acme):
    saver = CairnSaver(tenant="acme")
    configs = chain(saver, "gone", 3)
    chain(saver, "kept", 2)
    saver.put(configs[0], generate_checkpoint(), generate_metadata(step=9), {})  # a fork
    runs = [r.id for r in thread_runs(tenant=acme, thread_id="gone")]
    assert len(runs) == 2

    saver.delete_thread("gone")
    assert not Run.objects.filter(pk__in=runs).exists()
    assert not Checkpoint.objects.filter(run_id__in=runs).exists()
    assert not LangGraphThread.objects.filter(thread_id="gone").exists()
    assert LangGraphCheckpoint.objects.filter(thread__thread_id="gone").count() == 0
    assert saver.get_tuple(config("kept")) is not None
    deleted = AuditEvent.objects.filter(action="langgraph.thread_deleted")
    assert sorted(deleted.values_list("run_id", flat=True)) == sorted(runs)


def test_delete_thread_is_refused_under_a_legal_hold(acme):
    saver = CairnSaver(tenant="acme")
    chain(saver, "t1", 2)
    [run] = thread_runs(tenant=acme, thread_id="t1")
    Run.objects.filter(pk=run.pk).update(legal_hold=True)
    with pytest.raises(LegalHoldActive):
        saver.delete_thread("t1")
    Run.objects.filter(pk=run.pk).update(legal_hold=False)
    Tenant.objects.filter(pk=acme.pk).update(legal_hold=True)
    with pytest.raises(LegalHoldActive):
        saver.delete_thread("t1")
    assert saver.get_tuple(config("t1")) is not None


def test_prune_and_delete_for_runs_remove_content_but_keep_cairn_history(acme):
    saver = CairnSaver(tenant="acme")
    chain(saver, "t1", 4)
    [run] = thread_runs(tenant=acme, thread_id="t1")
    history = Checkpoint.objects.filter(run=run).count()

    saver.prune(["t1"], strategy="keep_latest")
    [kept] = saver.list(config("t1"))
    assert kept.checkpoint["channel_values"] == {"v": 3}
    assert kept.pending_writes == [("task-3", "v", 4)]
    # Values and writes of the pruned checkpoints are gone, not just unreachable.
    assert list(LangGraphBlob.objects.values_list("version", flat=True)) == ["3"]
    assert LangGraphWrite.objects.count() == 1
    assert Checkpoint.objects.filter(run=run).count() == history
    assert run_verify(tenant=acme, run_id=run.id)["ok"]

    chain(saver, "t2", 2, run_id="lg-run-1")
    saver.delete_for_runs(["lg-run-1"])
    assert list(saver.list(config("t2"))) == []
    assert not LangGraphBlob.objects.filter(thread__thread_id="t2").exists()

    saver.prune(["t1"], strategy="delete")
    assert list(saver.list(config("t1"))) == []
    with pytest.raises(InvalidRequest, match="Unknown prune strategy"):
        saver.prune(["t1"], strategy="everything")


def concat(state: list, writes: list) -> list:
    return state + [item for write in writes for item in write]


class Ticks(TypedDict):
    ticks: Annotated[list, DeltaChannel(concat, snapshot_frequency=3)]


def tick(state: Ticks) -> Ticks:
    return {"ticks": [len(state["ticks"])]}


def test_prune_keeps_what_a_delta_channel_is_rebuilt_from(acme):
    builder = StateGraph(Ticks)
    builder.add_node("tick", tick)
    builder.add_edge(START, "tick")
    builder.add_conditional_edges("tick", lambda s: END if len(s["ticks"]) >= 7 else "tick")
    saver = CairnSaver(tenant="acme")
    graph = builder.compile(checkpointer=saver)
    graph.invoke({"ticks": []}, config("t1"))
    assert graph.get_state(config("t1")).values["ticks"] == list(range(7))

    saver.prune(["t1"], strategy="keep_latest")
    # Snapshots land every third tick (steps 2, 5): the latest (step 7) is rebuilt from the
    # snapshot at step 5 plus the writes of steps 5 and 6, so those stay too.
    assert graph.get_state(config("t1")).values["ticks"] == list(range(7))
    assert sorted(LangGraphCheckpoint.objects.values_list("step", flat=True)) == [5, 6, 7]


def test_copy_thread_starts_a_cairn_fork_with_every_checkpoint(acme):
    saver = CairnSaver(tenant="acme")
    chain(saver, "src", 3)
    saver.copy_thread("src", "dst")
    source = [t.checkpoint for t in saver.list(config("src"))]
    assert [t.checkpoint for t in saver.list(config("dst"))] == source
    [origin] = thread_runs(tenant=acme, thread_id="src")
    [copy] = thread_runs(tenant=acme, thread_id="dst")
    assert copy.forked_from_run_id == origin.id
    with pytest.raises(InvalidRequest, match="already exists"):
        saver.copy_thread("src", "dst")
    # The copy continues on its own.
    saver.put(saver.get_tuple(config("dst")).config, generate_checkpoint(), generate_metadata(), {})
    assert len(list(saver.list(config("dst")))) == 4 and len(source) == 3


def test_it_refuses_pickle(acme):
    with pytest.raises(ValueError, match="never stores pickle"):
        CairnSaver(tenant="acme", serde=JsonPlusSerializer(pickle_fallback=True))
    saver = CairnSaver(tenant="acme")
    assert saver.serde.pickle_fallback is False
    with pytest.raises(InvalidRequest, match="never pickle"):
        services.thread_writes_put(
            tenant=acme,
            thread_id="t1",
            checkpoint_ns="",
            checkpoint_id="c1",
            task_id="task",
            task_path="",
            writes=[services.WriteIn(idx=0, channel="v", payload=payloads.Payload("pickle", b"x"))],
            replace=False,
            actor=Actor.system("test"),
        )


def test_a_value_moved_to_another_row_fails_authentication(acme):
    saver = CairnSaver(tenant="acme")
    configs = chain(saver, "t1", 2)
    first, second = LangGraphBlob.objects.order_by("version")
    LangGraphBlob.objects.filter(pk=second.pk).update(value_sealed=first.value_sealed)
    assert saver.get_tuple(configs[0]).checkpoint["channel_values"] == {"v": 0}
    with pytest.raises(IntegrityFailure, match="cannot be read"):
        saver.get_tuple(configs[1])


def test_key_rotation_re_encrypts_langgraph_payloads(acme, settings):
    saver = CairnSaver(tenant="acme")
    configs = chain(saver, "t1", 2)
    sealed_rows = (
        LangGraphCheckpoint.objects.count()
        + LangGraphBlob.objects.count()
        + LangGraphWrite.objects.count()
    )
    old, new = settings.CAIRN_ENCRYPTION_KEYS, new_key_spec("k2")
    settings.CAIRN_ENCRYPTION_KEYS = f"{new},{old}"
    assert langgraph_keys_rotate(batch_size=1) == sealed_rows
    # The old key can go: everything reads under the new one alone.
    settings.CAIRN_ENCRYPTION_KEYS = new
    got = saver.get_tuple(configs[1])
    assert (got.checkpoint["channel_values"], got.pending_writes) == (
        {"v": 1},
        [("task-1", "v", 2)],
    )
    assert langgraph_keys_rotate() == 0


def test_retention_deleting_cairn_checkpoints_deletes_what_they_recorded(acme):
    saver = CairnSaver(tenant="acme")
    configs = chain(saver, "t1", 3)
    first = LangGraphCheckpoint.objects.get(
        checkpoint_id=configs[0]["configurable"]["checkpoint_id"]
    )
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # retention's switch for the trigger
                cursor.execute("SET LOCAL cairn.retention = 'on'")
        Checkpoint.objects.filter(pk=first.cairn_checkpoint_id).retention_delete()
    assert saver.get_tuple(configs[0]) is None
    assert not LangGraphWrite.objects.filter(checkpoint_id=first.checkpoint_id).exists()
    assert saver.get_tuple(configs[2]).checkpoint["channel_values"] == {"v": 2}

    # A run that expires takes its thread with it.
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL cairn.retention = 'on'")
        Run.objects.filter(pk=first.run_id).delete()
    assert saver.get_tuple(config("t1")) is None
    assert not LangGraphThread.objects.exists()


def test_retention_expires_a_thread_nobody_wrote_for_the_expiry_period(acme):
    """LangGraph never tells a checkpointer that a graph finished, so a thread's run counts
    as ended for expiry once nobody wrote it for the period; a recent or held one stays."""
    saver = CairnSaver(tenant="acme")
    for thread, length in (("idle", 3), ("recent", 2), ("held", 2)):
        chain(saver, thread, length)
    runs = {t.thread_id: t.run_id for t in LangGraphThread.objects.all()}
    long_ago = timezone.now() - timedelta(days=400)
    Run.objects.filter(pk__in=[runs["idle"], runs["held"]]).update(updated_at=long_ago)
    admin = Actor.system("test-admin")
    legal_hold_set(tenant=acme, run_id=runs["held"], on=True, actor=admin)
    policy = retention_policy_save(
        tenant=acme, data=PolicyInput(intermediate_days=30, run_expiry_days=365), actor=admin
    )
    assert retention_preview(policy).runs_expired == 1

    report = retention_apply()

    assert report.runs_expired == 1
    assert saver.get_tuple(config("idle")) is None
    assert not Run.objects.filter(pk=runs["idle"]).exists()
    assert set(LangGraphThread.objects.values_list("thread_id", flat=True)) == {"recent", "held"}
    for thread in ("recent", "held"):
        assert saver.get_tuple(config(thread)).checkpoint["channel_values"] == {"v": 1}
    assert AuditEvent.objects.filter(action="retention.run_expired", run_id=runs["idle"]).exists()


def test_an_idle_branched_thread_expires_its_branch_then_the_run_it_forked_from(acme):
    saver = CairnSaver(tenant="acme")
    configs = chain(saver, "branched", 3)
    checkpoint = generate_checkpoint(channel_values={"v": 9}, channel_versions={"v": 9})
    saver.put(configs[0], checkpoint, generate_metadata(step=9), {"v": 9})  # a branch
    root, branch = thread_runs(tenant=acme, thread_id="branched")
    assert branch.forked_from_run_id == root.id
    long_ago = timezone.now() - timedelta(days=400)
    Run.objects.filter(pk__in=[root.id, branch.id]).update(updated_at=long_ago)
    admin = Actor.system("test-admin")
    retention_policy_save(
        tenant=acme, data=PolicyInput(intermediate_days=30, run_expiry_days=365), actor=admin
    )

    assert retention_apply().runs_expired == 1  # the root still has its fork
    assert set(Run.objects.values_list("pk", flat=True)) == {root.id}
    assert retention_apply().runs_expired == 1
    assert not Run.objects.exists()
    assert saver.get_tuple(config("branched")) is None


def test_cairn_runs_without_langgraph_installed():
    # LangGraph is an optional extra: every app, URL and the store's services load without it.
    code = (
        "import sys; sys.modules['langgraph'] = sys.modules['langchain_core'] = None\n"
        "import django; django.setup()\n"
        "from django.core.management import call_command; call_command('check')\n"
        "import langgraph_store.maintenance\n"
        "import langgraph_store.selectors\n"
        "import checkpoints.services.keys\n"
        "try:\n    import langgraph_store.saver\nexcept ImportError: pass\n"
        "else:\n    sys.exit('the saver imported without LangGraph')\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
