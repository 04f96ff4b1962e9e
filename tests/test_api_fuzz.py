"""Property-based tests of the whole API from its own OpenAPI document (schemathesis).

Every operation is called with generated valid and invalid input, as the admin of tenant
acme holding a real token. No input may produce a 500, and every status code returned must
be one the document lists for that operation. Ids in the path name real rows of acme (a
made-up id would stop every request at the 404), so the generated bodies and queries reach
the handlers.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance

from cairn.wsgi import application
from checkpoints.services.operations import operation_reserve
from tenants.services import Actor, token_issue
from tests.approvals_support import ask, at_review, draft

# Loading the document needs no database: the schema view has no authentication.
schema = schemathesis.openapi.from_wsgi("/api/v1/schema?format=json", application)


@pytest.fixture(autouse=True)
def _keep_the_test_connection_open():
    """Django closes the database connection at the end of each request; inside a test's
    transaction that would close the test database under us. Django's own test client
    disconnects the same handler for the same reason."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def admin_token(acme, alice, run) -> str:  # noqa: ANN001 - ``run`` gives the tenant data
    """Alice holds every role, so the generated input, not a role, decides each answer."""
    _, secret = token_issue(tenant=acme, user=alice, actor=Actor.system("fuzz"))
    return secret


@pytest.fixture
def known_rows(acme, run, bob) -> dict[str, str]:  # noqa: ANN001
    """Path parameters naming real rows of acme: the run (at its approval state, with bob's
    request pending), its first checkpoint, the draft, a reserved operation."""
    artifact = draft(acme)
    approval = ask(at_review(run, artifact), artifact, bob)
    operation, _ = operation_reserve(
        tenant=acme,
        run_id=run.id,
        idempotency_key="fuzz-key-1",
        action="publish",
        target="posts",
        request_fingerprint="fp",
        actor=Actor.system("fuzz"),
    )
    return {
        "run_id": str(run.id),
        "sequence": "1",
        "artifact_id": str(artifact.id),
        "key": operation.idempotency_key,
        "approval_id": str(approval.id),
    }


@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_generated_input_breaks_the_api(case, admin_token, known_rows):  # noqa: ANN001
    for name in case.path_parameters or {}:
        if name in known_rows:
            case.path_parameters[name] = known_rows[name]
    case.call_and_validate(
        headers={"Authorization": f"Bearer {admin_token}"},
        checks=[not_a_server_error, status_code_conformance],
    )
