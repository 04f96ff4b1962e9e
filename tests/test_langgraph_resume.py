"""The LangGraph example in real processes: killed with SIGKILL, resumed by a new process
from what Cairn stored, and approved through Cairn's approvals (the console's service)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection

from approvals.models import ApprovalRequest
from checkpoints.services.integrity import run_verify
from langgraph_store.models import LangGraphCheckpoint
from langgraph_store.selectors import thread_head_run, thread_runs
from tests.approvals_support import decide

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "langgraph_interrupt.py"


def example_env() -> dict[str, str]:
    """The example's environment: the real settings, pointed at this test's database."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "cairn.settings"}
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        env["CAIRN_SQLITE_PATH"] = str(db["NAME"])
        env.pop("DATABASE_URL", None)
    else:
        password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
        env["DATABASE_URL"] = (
            f"postgres://{db['USER']}{password}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
        )
    return env


class Example:
    """One process of the example; its output lines are collected as they come."""

    def __init__(self, *args: str, tmp_path: Path):
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self.stderr = (tmp_path / f"example-{os.getpid()}-{id(self)}.err").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE), *args, "--tenant", "acme"],
            cwd=ROOT,
            env=example_env(),
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line.rstrip("\n"))
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def wait_for(self, prefix: str, timeout: float = 120) -> str:
        """The first output line starting with ``prefix`` (fails if the process ends first)."""

        def found() -> str | None:
            return next((line for line in self.lines if line.startswith(prefix)), None)

        with self._seen:
            self._seen.wait_for(lambda: found() or self.proc.poll() is not None, timeout)
            line = found()
        assert line, f"no '{prefix}' line; output {self.lines}; rc {self.proc.poll()}"
        return line

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(timeout=30) == -signal.SIGKILL

    def finish(self) -> int:
        code = self.proc.wait(timeout=120)
        self.stderr.close()
        return code


def final_state(example: Example) -> dict:
    assert example.finish() == 0, example.lines
    return json.loads(example.wait_for("done: ").removeprefix("done: "))


def test_a_killed_process_waiting_for_a_person_is_resumed_by_a_new_one(acme, tmp_path):
    first = Example("run", "--thread", "t-wait", "--hold", tmp_path=tmp_path)
    first.wait_for("holding:")
    run = thread_head_run(tenant=acme, thread_id="t-wait")
    assert (run.state, run.status) == ("interrupted", "waiting_approval")
    first.kill()

    second = Example("resume", "--thread", "t-wait", "--answer", "approve", tmp_path=tmp_path)
    state = final_state(second)
    assert state["log"] == ["research", "draft", "review", "publish"]
    assert state["published"].startswith("# durable agents")
    run.refresh_from_db()
    assert (run.state, run.status) == ("running", "running")
    assert run_verify(tenant=acme, run_id=run.id)["ok"]


def test_a_process_killed_mid_step_continues_from_its_last_checkpoint(acme, carol, tmp_path):
    crashed = Example("run", "--thread", "t-crash", "--work-seconds", "600", tmp_path=tmp_path)
    crashed.wait_for("draft: working")
    crashed.kill()
    # The input, the start and the after-research checkpoints were in Cairn before draft began.
    assert LangGraphCheckpoint.objects.filter(thread__thread_id="t-crash").count() == 3

    again = Example("run", "--thread", "t-crash", tmp_path=tmp_path)
    assert again.wait_for("continuing from Cairn") == "continuing from Cairn before: draft"
    waiting = again.wait_for("waiting:")
    assert again.finish() == 0
    request = ApprovalRequest.objects.get(pk=waiting.rsplit("approval request ", 1)[1].rstrip(")"))

    # A reviewer decides in the console (its service), then the graph resumes from Cairn.
    decide(request, carol)
    state = final_state(Example("resume", "--thread", "t-crash", tmp_path=tmp_path))
    # research ran once: the new process started from Cairn, not from the prompt.
    assert state["log"] == ["research", "draft", "review", "publish"]
    assert state["decision"] == "approve"
    request.refresh_from_db()
    assert request.status == "consumed"
    assert [r.id for r in thread_runs(tenant=acme, thread_id="t-crash")] == [request.run_id]
