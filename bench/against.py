"""This checkout against an earlier commit of Cairn, on this machine, in one session (not a
test): a target set against a starting point ("4× today's rate") is read against that
starting point measured here, not against a figure from another machine.

    .venv/bin/python bench/against.py REF [--cases commit,http] [--rounds 3]

REF is checked out in a temporary worktree (removed afterwards) and each checkout runs its
own ``bench/run.py`` with ``BENCH_CASES``, in turn (REF then here, here then REF, ...), with
this checkout's venv; machines here drift by a fifth within half an hour, and alternating
spreads the drift over both. It prints every row both checkouts measured: the median of
the rounds' medians for each, and here's over REF's. Each run writes its checkout's
``bench/results/<cases>.*`` as any ``BENCH_CASES`` run does; nothing else is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _run(checkout: Path, cases: str) -> dict[tuple[str, str, str], dict]:
    """One ``bench/run.py`` of ``cases`` in ``checkout``: its rows by (case, system, variant)."""
    subprocess.run(
        [sys.executable, "bench/run.py"],
        cwd=checkout,
        env={**os.environ, "BENCH_CASES": cases},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    written = json.loads(
        (checkout / "bench" / "results" / f"{cases.replace(',', '-')}.json").read_text()
    )
    return {(r["case"], r["system"], r["variant"]): r for r in written["results"]}


def _figure(row: dict) -> tuple[float, str]:
    """A row's figure: commits a second for a rate row (the writers case and eight clients),
    else its median time."""
    if row["case"] == "writers" or "8 keep-alive clients" in row["variant"]:
        return row["throughput"], "/s"
    return row["median"], " ms"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("ref", help="the commit to measure against (e.g. an issue's start)")
    parser.add_argument("--cases", default="commit,http")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    before: list[dict] = []
    after: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="cairn-against-") as scratch:
        then = Path(scratch) / "ref"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(then), args.ref], cwd=HERE, check=True
        )
        try:
            for round_ in range(args.rounds):
                order = [(then, before), (HERE, after)]
                for checkout, into in order if round_ % 2 == 0 else order[::-1]:
                    print(
                        f"round {round_ + 1}: {'REF' if checkout == then else 'here'}", flush=True
                    )
                    into.append(_run(checkout, args.cases))
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(then)], cwd=HERE, check=True
            )
    print(f"\n{args.ref} (REF) against this checkout, {args.rounds} alternating rounds each:")
    print("| row | REF | here | here / REF |\n|---|---:|---:|---:|")
    for key in after[0]:
        if not all(key in run for run in before + after):
            continue
        ref = statistics.median(_figure(run[key])[0] for run in before)
        now = statistics.median(_figure(run[key])[0] for run in after)
        unit = _figure(after[0][key])[1]
        print(f"| {' · '.join(key)} | {ref:.2f}{unit} | {now:.2f}{unit} | {now / ref:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
