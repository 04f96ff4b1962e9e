"""LangGraph's own conformance suite (langgraph-checkpoint-conformance) against
AsyncCairnSaver, on SQLite (always) and PostgreSQL (CI). The report goes to the test log."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.conformance.report import CapabilityReport, ProgressCallbacks

from checkpoints.models import Run
from langgraph_store.saver import AsyncCairnSaver

# The suite reaches the database from asgiref's executor thread: committed data, one file.
pytestmark = pytest.mark.django_db(transaction=True)


def run_conformance(
    tenant,  # noqa: ANN001
    capsys,  # noqa: ANN001
    *,
    fencing: bool,
    capabilities: set[str] | None = None,
) -> CapabilityReport:
    @checkpointer_test(name=f"AsyncCairnSaver(fencing={fencing})")
    async def cairn_saver():  # noqa: ANN202
        yield AsyncCairnSaver(tenant=tenant.slug, fencing=fencing)

    async def main() -> CapabilityReport:
        try:
            return await validate(
                cairn_saver, capabilities=capabilities, progress=ProgressCallbacks.verbose()
            )
        finally:
            # The executor thread's connection must not outlive the test database.
            await sync_to_async(connections.close_all)()

    with capsys.disabled():
        print()
        if capabilities is not None:
            # LangGraph's report calls a capability left out of this run "not implemented".
            print(f"  Running only: {', '.join(sorted(capabilities))}")
        report = asyncio.run(main())
        report.print_report()
    return report


def assert_fully_conformant(report: CapabilityReport) -> None:
    failures = {name: r.failures for name, r in report.results.items() if r.failures}
    assert report.passed_all_base(), failures
    assert report.passed_all(), failures
    # Every capability, the extended ones too, is implemented and was exercised.
    assert {name for name, r in report.results.items() if r.detected} == {
        c.value for c in ALL_CAPABILITIES
    }
    assert report.conformance_level() == "FULL"


def test_the_async_saver_passes_every_conformance_capability(acme, capsys):
    report = run_conformance(acme, capsys, fencing=False)
    assert_fully_conformant(report)
    # The suite's threads became Cairn runs of the tenant.
    assert Run.objects.filter(tenant=acme, workflow_type="langgraph").exists()


def test_the_fencing_saver_still_conforms_where_it_reads_and_writes(acme, capsys):
    # Fencing must not refuse LangGraph's own sequences of reads and writes.
    capabilities = {"put", "put_writes", "get_tuple", "list"}
    report = run_conformance(acme, capsys, fencing=True, capabilities=capabilities)
    assert report.passed_all(), {n: r.failures for n, r in report.results.items()}
    assert {n for n, r in report.results.items() if r.passed} == capabilities


@pytest.mark.postgres
def test_the_async_saver_passes_every_conformance_capability_on_postgresql(
    postgres_only, acme, capsys
):
    assert_fully_conformant(run_conformance(acme, capsys, fencing=False))
