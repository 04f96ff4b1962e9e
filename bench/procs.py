"""Commit throughput with 1, 4, 8 and 16 writer *processes*, each on its own run (thread,
checkpoint thread): the GIL is out of the comparison, the database and the CPU are shared.

Cairn, the raw floors and LangGraph run in forked children of the benchmark (its Django
setup, fresh connections); DBOS runs in spawned processes of its own (``dbos_proc``). Every
child warms up, waits at a barrier, then commits for the same wall-clock window.
"""

from __future__ import annotations

import multiprocessing
import time

from bench import cairn_side
from bench.common import QUICK, Measurement, db_url

PROCESSES = (1, 4) if QUICK else (1, 4, 8, 16)
WINDOW_SECONDS = 1.0 if QUICK else 3.0
SIZE = 2 * 1024
SYSTEMS = ("cairn", "raw-sql", "raw-sql-cte", "langgraph")


def _committer(system: str, tenant, dsn: str):  # noqa: ANN001, ANN202
    if system == "cairn":
        return cairn_side.Committer(tenant, SIZE)
    if system == "raw-sql":
        return cairn_side.RawCommitter(tenant, SIZE, dsn)
    if system == "raw-sql-cte":
        return cairn_side.RawCteCommitter(tenant, SIZE, dsn)
    from bench.peers import LangGraphCommitter

    return LangGraphCommitter(dsn, SIZE)


def _writer(system: str, tenant_id, dsn: str, barrier, results) -> None:  # noqa: ANN001
    from django.db import connection

    from tenants.models import Tenant

    try:
        commit = _committer(system, Tenant.objects.get(pk=tenant_id), dsn)
        for _ in range(5):
            commit()
        barrier.wait()
        done, latencies = 0, []
        end = time.perf_counter() + WINDOW_SECONDS
        while (start := time.perf_counter()) < end:
            commit()
            latencies.append((time.perf_counter() - start) * 1000)
            done += 1
        results.put((done, latencies))
    except BaseException as exc:  # the parent must not wait forever for a broken child
        results.put(exc)
        raise
    finally:
        connection.close()


def _forked(system: str, tenant, processes: int) -> tuple[float, list[float]]:  # noqa: ANN001
    from django.db import connections

    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes)
    results = context.Queue()
    connections.close_all()  # children open their own
    children = [
        context.Process(target=_writer, args=(system, tenant.id, db_url(), barrier, results))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    total, latencies = 0, []
    for _ in children:
        item = results.get(timeout=300)
        if isinstance(item, BaseException):
            raise RuntimeError(f"a {system} writer failed: {item!r}")
        total += item[0]
        latencies += item[1]
    for child in children:
        child.join(timeout=60)
    return total / WINDOW_SECONDS, latencies


def _dbos(processes: int, dsn: str) -> tuple[float, list[float]]:
    from bench.dbos_proc import DbosProcess

    workers = [DbosProcess(dsn, executor_id=f"bench-{i}") for i in range(processes)]
    try:
        for worker in workers:
            worker.ready()
        start_at = time.time() + 0.5
        for worker in workers:
            worker.conn.send(("window", start_at, start_at + WINDOW_SECONDS, SIZE))
        total, latencies = 0, []
        for worker in workers:
            done, samples = worker.conn.recv()
            total += done
            latencies += samples
    finally:
        for worker in workers:
            worker.close()
    return total / WINDOW_SECONDS, latencies


def writers_case(tenant, dbos_dsn: str) -> list[Measurement]:  # noqa: ANN001
    from bench.peers import LangGraphCommitter

    graph = LangGraphCommitter(db_url(), SIZE)
    graph.setup()  # its tables, once, before the writers start
    graph.close()
    results = []
    for processes in PROCESSES:
        for system in (*SYSTEMS, "dbos"):
            if system == "dbos":
                ops, samples = _dbos(processes, dbos_dsn)
            else:
                ops, samples = _forked(system, tenant, processes)
            results.append(
                Measurement(
                    "writers",
                    system,
                    f"2KB, {processes} writer process{'es' if processes > 1 else ''}",
                    samples=samples,
                    throughput=ops,
                    note="commits per second summed over the processes, each on its own run",
                )
            )
            print(f"  writers: {system} × {processes}: {ops:.0f}/s", flush=True)
    return results
