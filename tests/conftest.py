"""The standing cast. In tenant acme: alice (admin), bob (operator), carol (reviewer).
Charlie is the outsider: admin of tenant globex, nothing in acme."""

from __future__ import annotations

import pytest
from django.db import connection
from rest_framework.test import APIClient

from checkpoints.services import changes
from checkpoints.services.workflows import workflow_register
from runtime.services.runs import run_create
from tenants.services import Actor, member_set_role, token_issue
from tests.factories import SIMPLE_DEFINITION, TenantFactory, UserFactory

# Real Celery worker subprocesses and a per-test broker (see tests/worker_fixtures.py).
pytest_plugins = [
    "tests.worker_fixtures",
    "tests.publishing",
    "tests.s3_fixtures",
    "tests.receivers",
    "tests.smtp_support",
    "tests.acme_rows_support",
]


def pytest_collection_modifyitems(config, items):  # noqa: ANN001
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(pytest.mark.django_db(transaction=True))


@pytest.fixture(autouse=True)
def _media_root(settings, tmp_path):  # noqa: ANN001
    settings.MEDIA_ROOT = tmp_path / "media"


@pytest.fixture(autouse=True)
def _run_change_listener():
    # A long-poll on PostgreSQL starts a listening connection; it must not outlive the
    # test's database (nothing to do when no test started one).
    yield
    changes.listener_stop()


@pytest.fixture
def postgres_only() -> None:
    """Fails (never skips) when a PostgreSQL test runs on another database."""
    assert connection.vendor == "postgresql", "this test needs PostgreSQL: set DATABASE_URL"


@pytest.fixture
def acme(db):  # noqa: ANN001
    return TenantFactory(slug="acme")


@pytest.fixture
def globex(db):  # noqa: ANN001
    return TenantFactory(slug="globex")


def _member(username: str, tenant, role: str):  # noqa: ANN001
    user = UserFactory(username=username)
    member_set_role(tenant=tenant, user=user, role=role, actor=Actor.system("test"))
    return user


@pytest.fixture
def alice(acme):  # noqa: ANN001
    return _member("alice", acme, "admin")


@pytest.fixture
def bob(acme):  # noqa: ANN001
    return _member("bob", acme, "operator")


@pytest.fixture
def carol(acme):  # noqa: ANN001
    return _member("carol", acme, "reviewer")


@pytest.fixture
def charlie(globex):  # noqa: ANN001
    return _member("charlie", globex, "admin")


@pytest.fixture
def api_as():
    """api_as(user, tenant) → an APIClient authenticated with a fresh bearer token."""

    def make(user, tenant) -> APIClient:  # noqa: ANN001
        _, secret = token_issue(tenant=tenant, user=user, actor=Actor.system("test"))
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        return client

    return make


@pytest.fixture
def workflow(acme):  # noqa: ANN001
    row, _ = workflow_register(
        tenant=acme, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    return row


@pytest.fixture
def run(acme, bob, workflow):  # noqa: ANN001
    return run_create(
        tenant=acme,
        workflow_type="research",
        inputs={"question": "why?"},
        execution="external",
        actor=Actor(user=bob),
    )
