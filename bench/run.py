"""`make bench`: Cairn against raw SQL, LangGraph's PostgresSaver and DBOS on one PostgreSQL.

Writes bench/results/latest.json, bench/results/latest.md (median, p95, ratio to Cairn) and
a PNG chart per case. BENCH_QUICK=1 makes a short smoke run; BENCH_CASES=takeover (or any
list of cases) runs only those and writes results/<cases>.json and .md. Needs PostgreSQL
and Redis on 127.0.0.1 (override with BENCH_PG_SERVER and BENCH_REDIS_URL).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    BENCH_DB,
    QUICK,
    RESULTS,
    Measurement,
    autovacuum_setting,
    db_url,
    recreate_database,
    setup_django,
    vacuum_analyze,
    write_json,
)

ALL_CASES = "commit,writers,http,restore,steps,contention,tracing,approval"
CASES = os.environ.get("BENCH_CASES", ALL_CASES).split(",")
# A run of some cases only (BENCH_CASES=takeover) writes results/<cases>.json and .md, so
# the last full run's latest.json, latest.md and charts stay as they are.
OUTPUT = "latest" if CASES == ALL_CASES.split(",") else "-".join(CASES)


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, {cpu}"


def ratios(measurements: list[Measurement]) -> list[dict]:
    """Each measurement beside the Cairn figure of the same case and variant."""
    rows = []
    baseline = {
        (m.case, m.variant): m.median
        for m in measurements
        if m.system in ("cairn", "cairn-service")
    }
    for m in measurements:
        row = m.summary()
        base = baseline.get((m.case, m.variant))
        if m.case == "http":
            base = next((x.median for x in measurements if x.system == "cairn-service"), None)
        row["ratio_to_cairn"] = round(m.median / base, 3) if base and m.median == m.median else None
        if m.case == "writers":  # throughput rows: the ratio of time per commit, as elsewhere
            cairn = next(
                (
                    x.throughput
                    for x in measurements
                    if x.case == m.case and x.system == "cairn" and x.variant == m.variant
                ),
                None,
            )
            row["ratio_to_cairn"] = round(cairn / m.throughput, 3) if cairn else None
        rows.append(row)
    return rows


def markdown(rows: list[dict], started: str, elapsed: float) -> str:
    lines = [
        f"Measured {started} on {machine()}, PostgreSQL (autovacuum {autovacuum_setting()}; "
        "each case starts after VACUUM ANALYZE of every table with rows) and Redis on loopback; "
        f"{'quick smoke run' if QUICK else 'full run'} in {elapsed:.0f} s.",
        "",
        "Round trips, statements (BEGIN and COMMIT included) and transactions are per "
        "operation, counted on the wire by a proxy (bench/wire.py).",
        "",
        "| case | system | variant | median | p95 | ops/s | ratio to Cairn "
        "| round trips | statements | transactions |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def count(value: float | None) -> str:
        return "" if value is None else f"{value:g}"

    for r in rows:
        ops = f"{r['throughput']:.0f}" if r["throughput"] else ""
        ratio = f"{r['ratio_to_cairn']:.2f}×" if r["ratio_to_cairn"] else ""
        timed = r["median"] == r["median"]  # a counts-only row has no time (NaN)
        median = f"{r['median']:.2f} {r['unit']}" if timed else "—"
        p95 = f"{r['p95']:.2f} {r['unit']}" if timed else "—"
        lines.append(
            f"| {r['case']} | {r['system']} | {r['variant']} | {median} | {p95} | {ops} "
            f"| {ratio} | {count(r.get('round_trips'))} | {count(r.get('statements'))} "
            f"| {count(r.get('transactions'))} |"
        )
    notes = sorted({r["note"] for r in rows if r["note"]})
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"


def charts(measurements: list[Measurement]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for case in sorted({m.case for m in measurements}):
        group = [
            m for m in measurements if m.case == case and m.unit == "ms" and m.median == m.median
        ]
        if not group:
            continue
        labels = [f"{m.system}\n{m.variant}" for m in group]
        fig, ax = plt.subplots(figsize=(max(6, len(group) * 1.1), 4))
        ax.bar(range(len(group)), [m.median for m in group], color="#4a7")
        ax.errorbar(
            range(len(group)),
            [m.median for m in group],
            yerr=[[0] * len(group), [m.p95 - m.median for m in group]],
            fmt="none",
            ecolor="#333",
            capsize=3,
        )
        ax.set_xticks(range(len(group)), labels, fontsize=7, rotation=30, ha="right")
        ax.set_ylabel("ms (median, whisker to p95)")
        ax.set_title(f"Cairn benchmark: {case}")
        fig.tight_layout()
        fig.savefig(RESULTS / f"{case}.png", dpi=110)
        plt.close(fig)


def case_begins(label: str) -> None:
    """Announce a case, and give it the databases as autovacuum would leave them on a live
    system (``vacuum_analyze``): no case pays for the dead rows of the cases before it."""
    print(label, flush=True)
    vacuum_analyze(BENCH_DB)
    vacuum_analyze(BENCH_DB + "_dbos")


def main() -> int:
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    clock = time.perf_counter()
    recreate_database(BENCH_DB)
    recreate_database(BENCH_DB + "_dbos")
    setup_django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from bench import cairn_side, cases

    tenant = cairn_side.tenant()
    measurements: list[Measurement] = []
    # DBOS runs only in processes of its own, started for its own rounds (bench/dbos_proc).
    dbos_dsn = db_url(BENCH_DB + "_dbos")
    if "commit" in CASES:
        case_begins("case 1: commit")
        counts = cases.commit_counts(tenant, dbos_dsn)
        measurements += cases.commit_case(tenant, dbos_dsn, counts)
    if "writers" in CASES:
        case_begins("case 1b: commit throughput, writer processes")
        from bench.procs import writers_case

        measurements += writers_case(tenant, dbos_dsn)
    if "http" in CASES:
        case_begins("case 2: commit over HTTP")
        from bench.http_case import http_case

        measurements += http_case(tenant)
    if "restore" in CASES:
        case_begins("case 3: restore vs history length")
        measurements += cases.restore_case(tenant)
    if "steps" in CASES:
        case_begins("case 4: step overhead on workers")
        from bench.workers import worker_case

        measurements += worker_case(tenant, dbos_dsn)
    if "takeover" in CASES and "steps" not in CASES:  # "steps" measures it too
        case_begins("case 4b: take-over of a killed worker's run, as shipped")
        from bench.workers import takeover_case

        measurements += takeover_case(tenant)
    if "contention" in CASES:
        case_begins("case 5: contention")
        measurements += cases.contention_case(tenant)
    if "tracing" in CASES:
        case_begins("case 6: what tracing costs (commit, worker step)")
        from bench.tracing_case import tracing_case

        measurements += tracing_case(tenant)
    if "approval" in CASES:
        case_begins("case 7: decision to next step (approve → the worker starts the next step)")
        from bench.approval_case import approval_case

        measurements += approval_case()
    rows = ratios(measurements)
    elapsed = time.perf_counter() - clock
    write_json(
        RESULTS / f"{OUTPUT}.json",
        {"started": started, "machine": machine(), "quick": QUICK, "results": rows},
    )
    table = markdown(rows, started, elapsed)
    (RESULTS / f"{OUTPUT}.md").write_text(table)
    if OUTPUT == "latest":
        charts(measurements)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
