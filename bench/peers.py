"""The peers, driven with the same payloads: LangGraph's PostgresSaver and DBOS steps."""

from __future__ import annotations

import time
import uuid

from bench.common import payload


class LangGraphCommitter:
    """``PostgresSaver.put`` + ``put_writes``: one LangGraph super-step's checkpoint. Two
    autocommit transactions: not atomic together, no version check, no outbox."""

    def __init__(self, dsn: str, size: int) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg import Connection
        from psycopg.rows import dict_row

        self.conn = Connection.connect(
            dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
        self.saver = PostgresSaver(self.conn)
        self.config = {"configurable": {"thread_id": str(uuid.uuid4()), "checkpoint_ns": ""}}
        self.state = payload(size)
        self.step = 0

    def setup(self) -> None:
        self.saver.setup()

    def __call__(self, _index: int = 0) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        self.step += 1
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"state": self.state}
        checkpoint["channel_versions"] = {"state": self.step}
        config = self.saver.put(
            self.config, checkpoint, {"source": "loop", "step": self.step}, {"state": self.step}
        )
        self.saver.put_writes(
            config, [("progress", {"step": self.step})], task_id=str(uuid.uuid4())
        )
        self.config = config

    def latest(self) -> object:
        return self.saver.get_tuple({"configurable": {**self.config["configurable"]}})

    def close(self) -> None:
        self.conn.close()


class Dbos:
    """DBOS in this process: a workflow of no-op steps, each returning the agent state, so
    each step's checkpoint (its recorded output) carries the same payload as the others."""

    timings: list[float] = []

    def __init__(self, dsn: str, executor_id: str = "bench") -> None:
        from dbos import DBOS

        self.DBOS = DBOS
        DBOS(
            config={
                "name": "cairn-bench",
                "system_database_url": dsn,
                "log_level": "WARNING",
                "executor_id": executor_id,
            }
        )

        @DBOS.step()
        def noop_step(state: dict) -> dict:
            return state

        @DBOS.workflow()
        def steps_workflow(count: int, size: int) -> int:
            state = payload(size)
            for _ in range(count):
                start = time.perf_counter()
                noop_step(state)
                Dbos.timings.append((time.perf_counter() - start) * 1000)
            return count

        self.workflow = steps_workflow
        DBOS.launch()

    def run(self, count: int, size: int) -> list[float]:
        Dbos.timings = []
        self.workflow(count, size)
        return list(Dbos.timings)

    def close(self) -> None:
        self.DBOS.destroy()
