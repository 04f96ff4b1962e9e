"""DBOS in a process of its own, driven over a pipe.

DBOS runs background pollers in the process that launches it. Timed in the benchmark's own
process they would share its GIL with every other system's rounds, so DBOS is launched only
here, only for its own rounds: the benchmark asks this process for a block of steps, and
alternates those blocks with the other systems' interleaved rounds.
"""

from __future__ import annotations

import multiprocessing
import time


def _serve(conn, dsn: str, executor_id: str) -> None:  # noqa: ANN001
    from bench.peers import Dbos

    dbos = Dbos(dsn, executor_id=executor_id)
    conn.send("ready")
    try:
        while True:
            command, *args = conn.recv()
            if command == "steps":  # (count, size) → per-step ms inside one workflow
                count, size = args
                conn.send(dbos.run(count, size))
            elif command == "workflows":  # (runs, steps, size) → ms per step of each run
                runs, steps, size = args
                samples = []
                for _ in range(runs):
                    start = time.perf_counter()
                    dbos.workflow(steps, size)
                    samples.append((time.perf_counter() - start) * 1000 / steps)
                conn.send(samples)
            elif command == "window":  # (start, end, size): steps done in the wall window
                start_at, end_at, size = args
                while time.time() < start_at:
                    time.sleep(0.001)
                done, latencies = 0, []
                while time.time() < end_at:
                    latencies += dbos.run(20, size)
                    done += 20
                conn.send((done, latencies))
            elif command == "threads":  # (writers, per_writer, size) → (ops/s, latencies)
                writers, per_writer, size = args
                conn.send(_threads(dbos, writers, per_writer, size))
            elif command == "stop":
                conn.send("stopped")
                return
    finally:
        dbos.close()


def _threads(dbos, writers: int, per_writer: int, size: int) -> tuple[float, list[float]]:  # noqa: ANN001
    import threading

    from bench.common import timed_threads
    from bench.peers import Dbos

    Dbos.timings = []
    threads = [
        threading.Thread(target=dbos.workflow, args=(per_writer, size)) for _ in range(writers)
    ]
    elapsed = timed_threads(threads)
    return per_writer * writers / elapsed, list(Dbos.timings)


class DbosProcess:
    """``with DbosProcess(dsn) as dbos: dbos.steps(100, 2048)``."""

    def __init__(self, dsn: str, executor_id: str = "bench") -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, dsn, executor_id), daemon=True)
        self.process.start()

    def ready(self) -> DbosProcess:
        if self.conn.recv() != "ready":
            raise RuntimeError("DBOS did not start")
        return self

    def call(self, *command: object) -> object:
        self.conn.send(command)
        return self.conn.recv()

    def steps(self, count: int, size: int) -> list[float]:
        return self.call("steps", count, size)

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.call("stop")
            except (EOFError, OSError):
                pass
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()

    def __enter__(self) -> DbosProcess:
        return self.ready()

    def __exit__(self, *exc: object) -> None:
        self.close()
