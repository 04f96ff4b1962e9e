"""Case 6: what tracing costs, on the rows it can touch: the commit and the worker step.

Each row is measured twice, by processes identical but for the standard OTEL_* variables:
one without (tracing off, as Cairn runs by default), one exporting every span over
OTLP/HTTP to a receiver on loopback (``telemetry.otlp_receiver``, in a process of its own,
decoding every span as a collector would). The ratio column is the traced row's time over
the untraced one's.

- **commit**: two committer processes (spawned, Django set up in each) commit 2 KB and
  50 KB checkpoints through ``checkpoint_commit``, as a worker does; their blocks alternate.
- **steps**: two solo workers on two queues run six-step runs of no-op steps, in rounds:
  within a round the runs alternate between them (ABBA); each round gives a ratio (its
  traced median over its untraced one), and the row the target reads is the median of
  those ratios, which load on a shared machine moves far less than either side's time.

Beside the wall-clock rows, each is also counted in CPU time: what the measured process
(the committer, the worker: every thread, the exporter's included, up to its last export)
spent per operation. On a shared machine CPU time moves less than wall-clock time.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import QUICK, ROOT, Measurement, cpu_seconds

SIZES = {"2KB": 2 * 1024, "50KB": 50 * 1024}
# (label, size, in a trace): a commit joins its caller's trace and never starts one, so
# outside any trace it costs a look at the context; in a runner's trace (the context its
# traceparent gives a request) it records a span.
COMMITS = (
    ("commit 2KB sequential, outside any trace", SIZES["2KB"], False),
    ("commit 2KB sequential, in a runner's trace", SIZES["2KB"], True),
    ("commit 50KB sequential, in a runner's trace", SIZES["50KB"], True),
)
RUNNER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CPU_NOTE = (
    "CPU time: all the measured process's threads (the span exporter's too, up to its last "
    "export) over the measured operations, divided by their number"
)
ROUNDS = 60 if QUICK else 400
BLOCK = 40
# The step rows: rounds of runs on each worker, alternating (ABBA) within a round.
STEP_ROUNDS = 5 if QUICK else 20
RUNS_PER_ROUND = 4 if QUICK else 10
ROUNDS_NOTE = "the rounds' ratios, sorted: "
TRACED = "cairn-traced"
NOTE = (
    "tracing on: every span exported over OTLP/HTTP to a loopback receiver (its own "
    "process); the ratio is to the same processes without OTEL_* variables"
)


class Receiver:
    """``python -m telemetry.otlp_receiver`` on a free port, in a process of its own."""

    def __enter__(self) -> Receiver:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "telemetry.otlp_receiver", "--port", "0"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()
        self.endpoint = f"http://127.0.0.1:{int(line.rsplit(':', 1)[1])}"
        return self

    def spans(self) -> int:
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.endpoint}/stats", timeout=10) as answer:  # noqa: S310
            return json.loads(answer.read())["spans"]

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.process.stdout.close()


def _otel(endpoint: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "cairn-bench"}


def _serve(conn, environ: dict[str, str]) -> None:  # noqa: ANN001
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        del os.environ[name]
    os.environ.update(environ)
    from bench.common import setup_django, time_each

    setup_django()
    from bench import cairn_side
    from telemetry.tracing import run_context

    tenant = cairn_side.tenant()
    committers = {size: cairn_side.Committer(tenant, size) for size in SIZES.values()}
    conn.send("ready")
    while True:
        command, *args = conn.recv()
        if command == "commits":
            size, count, joined = args
            with run_context(RUNNER if joined else ""):
                conn.send(time_each(committers[size], count, warmup=0))
        elif command == "cpu":  # CPU seconds so far, every thread, after a last export
            from opentelemetry import trace

            getattr(trace.get_tracer_provider(), "force_flush", lambda: None)()
            conn.send(time.process_time())
        elif command == "stop":
            from opentelemetry import trace

            # Export what is still queued before the process ends (the SDK does at exit).
            getattr(trace.get_tracer_provider(), "force_flush", lambda: None)()
            conn.send("stopped")
            return


class Committers:
    """A committer process, traced or not."""

    def __init__(self, environ: dict[str, str]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, environ), daemon=True)
        self.process.start()
        if self.conn.recv() != "ready":
            raise RuntimeError("the committer process did not start")

    def commits(self, size: int, count: int, joined: bool) -> list[float]:
        self.conn.send(("commits", size, count, joined))
        return self.conn.recv()

    def cpu(self) -> float:
        self.conn.send(("cpu",))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(("stop",))
        self.conn.recv()
        self.process.join(timeout=30)


def _commit_rows(endpoint: str) -> list[Measurement]:
    # The children inherit the bench's environment (database, key) with or without OTEL_*.
    plain = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    off, on = Committers(plain), Committers({**plain, **_otel(endpoint)})
    rows = []
    try:
        for variant, size, joined in COMMITS:
            samples = {"cairn": [], TRACED: []}
            cpu = {}
            for block in range(0, BLOCK + ROUNDS, BLOCK):
                if block == BLOCK:  # the first block warms both up
                    cpu = {"cairn": off.cpu(), TRACED: on.cpu()}
                first, second = (off, on) if block // BLOCK % 2 == 0 else (on, off)
                for system, committer in (
                    ("cairn" if first is off else TRACED, first),
                    ("cairn" if second is off else TRACED, second),
                ):
                    timings = committer.commits(size, BLOCK, joined)
                    if block >= BLOCK:
                        samples[system] += timings
            spent = {"cairn": off.cpu() - cpu["cairn"], TRACED: on.cpu() - cpu[TRACED]}
            for system in samples:
                rows.append(
                    Measurement(
                        "tracing",
                        system,
                        f"{variant}, CPU time per commit",
                        samples=[spent[system] * 1000 / ROUNDS],
                        note=CPU_NOTE,
                    )
                )
            for system, values in samples.items():
                rows.append(
                    Measurement(
                        "tracing",
                        system,
                        f"{variant}, child process",
                        samples=values,
                        throughput=1000 / (sum(values) / len(values)),
                        note=NOTE if system == TRACED else "",
                    )
                )
    finally:
        off.close()
        on.close()
    return rows


def _step_rows(tenant, endpoint: str) -> list[Measurement]:  # noqa: ANN001
    from django.conf import settings

    import bench.noop_workflow  # noqa: F401 - declares the workflows in this process too
    from bench.workers import _finished, _purge, _wait, _worker
    from cairn.celery import app
    from runtime.registry import workflows_sync
    from runtime.services.runs import run_create
    from tenants.services import Actor

    settings.CAIRN_DISPATCH_ON_COMMIT = True
    workflows_sync()
    _purge()
    logs = Path(tempfile.mkdtemp(prefix="cairn-bench-tracing-"))
    queues = {"cairn": "bench-plain", TRACED: "bench-traced"}
    saved_queue = app.conf.task_default_queue
    saved_env = dict(os.environ)
    workers = {}
    try:
        for system, queue in queues.items():
            os.environ["CAIRN_TASK_QUEUE"] = queue
            for name in [n for n in os.environ if n.startswith("OTEL_")]:
                del os.environ[name]
            if system == TRACED:
                os.environ.update(_otel(endpoint))
            workers[system] = _worker(system, logs, lease_seconds=30)
        os.environ.clear()
        os.environ.update(saved_env)

        def run_on(system: str) -> float:
            app.conf.task_default_queue = queues[system]  # where run_create's command goes
            begin = time.perf_counter()
            run = run_create(
                tenant=tenant,
                workflow_type="bench_noop",
                execution="worker",
                actor=Actor.system("bench"),
            )
            if not _wait(lambda: _finished(run.pk), 60):
                raise RuntimeError(f"a six-step run on the {system} worker did not finish")
            return (time.perf_counter() - begin) * 1000 / 6

        for system in queues:  # warm each worker up (imports, connections, statements)
            run_on(system)
            run_on(system)
        time.sleep(6)  # the traced worker's warm-up spans exported
        cpu = {system: cpu_seconds(worker.pid) for system, worker in workers.items()}
        samples = {system: [] for system in queues}
        # Interleaved rounds: in each, the two workers' runs alternate (ABBA), and the
        # round's ratio is its traced median over its untraced one. Load on a shared
        # machine moves both sides of a round alike; the median of the rounds' ratios is
        # the figure that does not move with it.
        round_ratios = []
        for _ in range(STEP_ROUNDS):
            this = {system: [] for system in queues}
            for index in range(RUNS_PER_ROUND * 2):
                system = list(queues)[index % 2 if index // 2 % 2 == 0 else 1 - index % 2]
                this[system].append(run_on(system))
            for system, values in this.items():
                samples[system] += values
            round_ratios.append(statistics.median(this[TRACED]) / statistics.median(this["cairn"]))
        time.sleep(6)  # its last batch exported (OTEL_BSP_SCHEDULE_DELAY, 5 s)
        spent = {s: cpu_seconds(w.pid) - cpu[s] for s, w in workers.items()}
    finally:
        app.conf.task_default_queue = saved_queue
        for worker in workers.values():
            worker.terminate()
            worker.wait(timeout=30)
    return (
        [
            Measurement(
                "tracing",
                system,
                "per step, six-step run on a worker",
                samples=values,
                note=NOTE if system == TRACED else "",
            )
            for system, values in samples.items()
        ]
        + [
            Measurement(
                "tracing",
                system,
                "per step, six-step run on a worker, the worker's CPU time",
                samples=[spent[system] * 1000 / (len(samples[system]) * 6)],
                note=CPU_NOTE,
            )
            for system in samples
        ]
        + [
            Measurement(
                "tracing",
                TRACED,
                f"per step, six-step run on a worker: median of {STEP_ROUNDS} interleaved "
                "rounds' ratios (traced over untraced)",
                unit="×",
                samples=round_ratios,
                note=ROUNDS_NOTE + ", ".join(f"{r:.3f}" for r in sorted(round_ratios)),
            )
        ]
    )


def tracing_case(tenant) -> list[Measurement]:  # noqa: ANN001
    with Receiver() as receiver:
        rows = _commit_rows(receiver.endpoint)
        rows += _step_rows(tenant, receiver.endpoint)
        time.sleep(6)  # the workers' last batch (OTEL_BSP_SCHEDULE_DELAY, 5 s)
        print(f"  the receiver decoded {receiver.spans()} spans", flush=True)
    return rows
