"""The benchmark cases `make bench` runs (docs/performance.md). Each returns a list of
Measurements."""

from __future__ import annotations

import threading
import time

from bench import cairn_side
from bench.common import BENCH_DB, QUICK, Measurement, db_url, time_each
from bench.peers import LangGraphCommitter

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


SEQUENTIAL = ("cairn", "raw-sql", "raw-sql-cte", "langgraph")
NOTES = {
    "raw-sql": "floor: BEGIN, UPDATE, INSERT, INSERT, COMMIT on prepared statements (5 round "
    "trips); no run read, no validation, hashing or encryption",
    "raw-sql-cte": "physical floor: the same three writes as one data-modifying CTE on a "
    "prepared statement (1 round trip)",
    "langgraph": "LangGraph: put + put_writes, two autocommit transactions: not atomic "
    "together, no version check, no outbox",
    "dbos": "one step checkpoint inside a running workflow (DBOS in its own process)",
}


def _sequential(tenant, size: int) -> dict:  # noqa: ANN001
    dsn = db_url()
    graph = LangGraphCommitter(dsn, size)
    graph.setup()
    return {
        "cairn": cairn_side.Committer(tenant, size),
        "raw-sql": cairn_side.RawCommitter(tenant, size, dsn),
        "raw-sql-cte": cairn_side.RawCteCommitter(tenant, size, dsn),
        "langgraph": graph,
    }


def commit_case(tenant, dbos_dsn: str, counts: dict) -> list[Measurement]:  # noqa: ANN001
    """Sequential commits, the systems' rounds interleaved (each round times every system
    once, in a rotating order), DBOS's in blocks between them from its own process; then
    WRITERS threads per system in one process (GIL-bound; the process rows are in
    ``procs``)."""
    from bench.dbos_proc import DbosProcess

    results = []
    with DbosProcess(dbos_dsn) as dbos:
        for variant, size in SIZES.items():
            systems = _sequential(tenant, size)
            if variant == "2KB":
                systems["cairn, reads the run"] = cairn_side.Committer(
                    tenant, size, pass_head=False
                )
            names = list(systems)
            samples: dict[str, list[float]] = {name: [] for name in [*names, "dbos"]}
            block = WARMUP
            for first in range(0, WARMUP + ROUNDS, block):
                for index in range(first, first + block):
                    turn = index % len(names)
                    for name in names[turn:] + names[:turn]:
                        start = time.perf_counter()
                        systems[name](index)
                        if index >= WARMUP:
                            samples[name].append((time.perf_counter() - start) * 1000)
                timings = dbos.steps(block, size)
                if first >= WARMUP:
                    samples["dbos"] += timings
            for committer in systems.values():
                getattr(committer, "close", lambda: None)()
            for name, values in samples.items():
                system, _, extra = name.partition(", ")
                label = f"{variant} sequential" + (f", {extra}" if extra else "")
                results.append(
                    Measurement(
                        "commit",
                        system,
                        label,
                        samples=values,
                        throughput=1000 / (sum(values) / len(values)),
                        note=NOTES.get(system, ""),
                    ).counted(counts.get(name))
                )
        per_writer = max(10, ROUNDS // 4)
        for variant, size in SIZES.items():
            for system, make in [
                ("cairn", lambda size=size: cairn_side.Committer(tenant, size)),
                ("raw-sql", lambda size=size: cairn_side.RawCommitter(tenant, size, db_url())),
                (
                    "raw-sql-cte",
                    lambda size=size: cairn_side.RawCteCommitter(tenant, size, db_url()),
                ),
                ("langgraph", lambda size=size: _lg(db_url(), size)),
            ]:
                ops, values = _concurrent(make, per_writer)
                results.append(
                    Measurement(
                        "commit",
                        system,
                        f"{variant} {WRITERS} writer threads",
                        samples=values,
                        throughput=ops,
                    )
                )
            ops, values = dbos.call("threads", WRITERS, per_writer, size)
            results.append(
                Measurement(
                    "commit",
                    "dbos",
                    f"{variant} {WRITERS} writer threads",
                    samples=values,
                    throughput=ops,
                )
            )
    return results


def _lg(dsn: str, size: int) -> LangGraphCommitter:
    return LangGraphCommitter(dsn, size)


def commit_counts(tenant, dbos_dsn: str, operations: int = 50) -> dict:  # noqa: ANN001
    """Round trips, statements and transactions per commit of each system, counted on the
    wire by a proxy (``bench.wire``), with warm connections and prepared statements."""
    from django.db import connection

    from bench.dbos_proc import DbosProcess
    from bench.wire import CountingProxy

    size = SIZES["2KB"]
    counts = {}
    with CountingProxy() as proxy:
        dsn = proxy.dsn(BENCH_DB)
        saved = dict(connection.settings_dict)
        connection.close()
        connection.settings_dict.update(
            HOST="127.0.0.1",
            PORT=str(proxy.port),
            OPTIONS={**saved["OPTIONS"], "sslmode": "disable", "gssencmode": "disable"},
        )
        try:
            graph = LangGraphCommitter(dsn, size)
            graph.setup()
            systems = {
                "cairn": cairn_side.Committer(tenant, size),
                "cairn, reads the run": cairn_side.Committer(tenant, size, pass_head=False),
                "raw-sql": cairn_side.RawCommitter(tenant, size, dsn),
                "raw-sql-cte": cairn_side.RawCteCommitter(tenant, size, dsn),
                "langgraph": graph,
            }
            for name, committer in systems.items():
                for index in range(10):
                    committer(index)
                proxy.reset()
                for index in range(operations):
                    committer(index)
                counts[name] = proxy.snapshot().per(operations)
                getattr(committer, "close", lambda: None)()
        finally:
            connection.close()
            connection.settings_dict.clear()
            connection.settings_dict.update(saved)
        with DbosProcess(proxy.dsn(BENCH_DB + "_dbos")) as dbos:
            dbos.steps(10, size)
            proxy.reset()
            dbos.steps(operations, size)
            counts["dbos"] = proxy.snapshot().per(operations)
    for name, value in counts.items():
        print(f"  {name}: {value.label()} per commit", flush=True)
    return counts


def restore_case(tenant) -> list[Measurement]:  # noqa: ANN001
    """Load and validate the latest checkpoint (the runtime's restore) at growing history.

    Histories are built first; then each round measures every length in turn, so drift in
    the machine's load falls on all lengths alike.
    """
    from checkpoints.models import Run
    from runtime.restore import restore_latest

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

    from cairn.errors import ConcurrentCheckpointWrite
    from checkpoints.models import Checkpoint, Run
    from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
    from checkpoints.services.integrity import run_verify
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
                        request=CommitRequest(
                            expected_version=version,
                            state="s",
                            step="s",
                            envelope=groups,
                            actor=actor,
                        ),
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
