"""The benchmark cases of issue 9. Each returns a list of Measurements."""

from __future__ import annotations

import threading
import time

from bench import cairn_side
from bench.common import QUICK, Measurement, db_url, time_each
from bench.peers import Dbos, LangGraphCommitter

SIZES = {"2KB": 2 * 1024, "50KB": 50 * 1024}
ROUNDS = 60 if QUICK else 400
WARMUP = 10 if QUICK else 40
WRITERS = 8


def _concurrent(make, per_writer: int) -> tuple[float, list[float]]:  # noqa: ANN001
    """Run WRITERS threads, each with its own committer; return (ops/s, latencies)."""
    from django.db import connection

    committers = [None] * WRITERS
    latencies: list[list[float]] = [[] for _ in range(WRITERS)]
    barrier = threading.Barrier(WRITERS + 1)

    def writer(index: int) -> None:
        try:
            committers[index] = make()
            barrier.wait()
            latencies[index] = time_each(committers[index], per_writer, warmup=0)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    for committer in committers:
        getattr(committer, "close", lambda: None)()
    flat = [x for row in latencies for x in row]
    return len(flat) / elapsed, flat


def commit_case(tenant, dbos: Dbos) -> list[Measurement]:  # noqa: ANN001
    results = []
    dsn = db_url()
    for variant, size in SIZES.items():
        cairn = cairn_side.Committer(tenant, size)
        samples = time_each(cairn, ROUNDS, WARMUP)
        results.append(
            Measurement(
                "commit",
                "cairn",
                f"{variant} sequential",
                samples=samples,
                throughput=1000 / (sum(samples) / len(samples)),
            )
        )
        raw = cairn_side.RawCommitter(tenant, size, dsn)
        samples = time_each(raw, ROUNDS, WARMUP)
        raw.close()
        results.append(
            Measurement(
                "commit",
                "raw-sql",
                f"{variant} sequential",
                samples=samples,
                throughput=1000 / (sum(samples) / len(samples)),
            )
        )
        graph = LangGraphCommitter(dsn, size)
        graph.setup()
        samples = time_each(graph, ROUNDS, WARMUP)
        graph.close()
        results.append(
            Measurement(
                "commit",
                "langgraph",
                f"{variant} sequential",
                samples=samples,
                throughput=1000 / (sum(samples) / len(samples)),
            )
        )
        dbos.run(WARMUP, size)
        samples = dbos.run(ROUNDS, size)
        results.append(
            Measurement(
                "commit",
                "dbos",
                f"{variant} sequential",
                samples=samples,
                throughput=1000 / (sum(samples) / len(samples)),
                note="one step checkpoint inside a running workflow",
            )
        )
        per_writer = max(10, ROUNDS // 4)
        for system, make in [
            ("cairn", lambda size=size: cairn_side.Committer(tenant, size)),
            ("raw-sql", lambda size=size: cairn_side.RawCommitter(tenant, size, dsn)),
            ("langgraph", lambda size=size: _lg(dsn, size)),
        ]:
            ops, samples = _concurrent(make, per_writer)
            results.append(
                Measurement(
                    "commit",
                    system,
                    f"{variant} {WRITERS} writers",
                    samples=samples,
                    throughput=ops,
                )
            )
        ops, samples = _dbos_concurrent(dbos, per_writer, size)
        results.append(
            Measurement(
                "commit", "dbos", f"{variant} {WRITERS} writers", samples=samples, throughput=ops
            )
        )
    return results


def _lg(dsn: str, size: int) -> LangGraphCommitter:
    return LangGraphCommitter(dsn, size)


def _dbos_concurrent(dbos: Dbos, per_writer: int, size: int) -> tuple[float, list[float]]:
    Dbos.timings = []
    threads = [
        threading.Thread(target=dbos.workflow, args=(per_writer, size)) for _ in range(WRITERS)
    ]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    return per_writer * WRITERS / elapsed, list(Dbos.timings)


def restore_case(tenant) -> list[Measurement]:  # noqa: ANN001
    """Load and validate the latest checkpoint (the runtime's restore) at growing history.

    Histories are built first; then each round measures every length in turn, so drift in
    the machine's load falls on all lengths alike.
    """
    from checkpoints.models import Run
    from checkpoints.runtime.restore import restore_latest

    lengths = [10, 1000] if QUICK else [10, 1000, 10000]
    dsn = db_url()
    runs, graphs = {}, {}
    for length in lengths:
        committer = cairn_side.Committer(tenant, SIZES["2KB"])
        for _ in range(length - 1):
            committer()
        runs[length] = Run.objects.select_related("workflow").get(pk=committer.run.id)
        graph = LangGraphCommitter(dsn, SIZES["2KB"])
        graph.setup()
        for _ in range(length):
            graph()
        graphs[length] = graph
    samples = {(system, n): [] for system in ("cairn", "langgraph") for n in lengths}
    for round_index in range(WARMUP + ROUNDS):
        for length in lengths:
            for system, load in (
                ("cairn", lambda n=length: restore_latest(runs[n])),
                ("langgraph", lambda n=length: graphs[n].latest()),
            ):
                start = time.perf_counter()
                load()
                if round_index >= WARMUP:
                    samples[system, length].append((time.perf_counter() - start) * 1000)
    for graph in graphs.values():
        graph.close()
    return [
        Measurement("restore", system, f"history {length}", samples=samples[system, length])
        for length in lengths
        for system in ("cairn", "langgraph")
    ]


def contention_case(tenant, seconds: float = 5.0) -> list[Measurement]:  # noqa: ANN001
    """16 writers race on one run for a few seconds; exactly one successor per parent."""
    from django.db import connection

    from checkpoints.errors import ConcurrentCheckpointWrite
    from checkpoints.models import Checkpoint, Run
    from checkpoints.services.checkpoints import checkpoint_commit, run_verify
    from tenants.services import Actor

    run = cairn_side.new_run(tenant)
    groups = cairn_side.groups({"n": 1})
    writers = 16
    counts = {"won": 0, "conflicts": 0}
    lock = threading.Lock()
    deadline = time.perf_counter() + (2.0 if QUICK else seconds)
    latencies: list[float] = []

    def writer(index: int) -> None:
        actor = Actor.system(f"writer-{index}")
        try:
            while time.perf_counter() < deadline:
                version = Run.objects.values_list("version", flat=True).get(pk=run.id)
                start = time.perf_counter()
                try:
                    checkpoint_commit(
                        tenant=tenant,
                        run_id=run.id,
                        expected_version=version,
                        state="s",
                        step="s",
                        envelope=groups,
                        actor=actor,
                    )
                    key = "won"
                except ConcurrentCheckpointWrite:
                    key = "conflicts"
                with lock:
                    counts[key] += 1
                    latencies.append((time.perf_counter() - start) * 1000)
        finally:
            connection.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    sequences = list(
        Checkpoint.objects.filter(run_id=run.id)
        .order_by("sequence")
        .values_list("sequence", flat=True)
    )
    contiguous = sequences == list(range(1, len(sequences) + 1))
    verified = run_verify(tenant=tenant, run_id=run.id)["ok"]
    note = (
        f"{counts['won']} accepted, {counts['conflicts']} refused; {len(sequences)} checkpoints,"
        f" sequences contiguous: {contiguous}, one successor per parent and chain verified: "
        f"{verified and contiguous and len(sequences) == counts['won'] + 1}"
    )
    return [
        Measurement(
            "contention",
            "cairn",
            "16 writers, one run",
            samples=latencies,
            throughput=(counts["won"] + counts["conflicts"]) / elapsed,
            note=note,
        ),
        Measurement(
            "contention",
            "cairn",
            "conflicts handled per second",
            unit="1/s",
            samples=[counts["conflicts"] / elapsed],
            note=note,
        ),
    ]
