"""The retention job as real processes on the default database (SQLite locally; CI also
runs these on PostgreSQL, next to the PostgreSQL-only ones): killed mid-batch then rerun,
and two jobs at once."""

from __future__ import annotations

import pytest

from tests import retention_jobs as jobs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def estate(acme, bob, workflow):  # noqa: ANN001, ANN201
    return jobs.make_estate(acme, bob)


def test_a_killed_job_loses_nothing_and_a_rerun_finishes(acme, estate):
    jobs.kill_mid_job_then_rerun(acme, estate)


def test_two_jobs_at_once_lose_nothing_and_delete_nothing_twice(acme, estate):
    jobs.two_jobs_at_once(acme, estate)
