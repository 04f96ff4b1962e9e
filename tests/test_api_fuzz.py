"""Property-based tests of the whole API from its own OpenAPI document (schemathesis).

Every operation is called with generated valid and invalid input, as the admin of tenant
acme holding a real token. No input may produce a 500, and every status code returned must
be one the document lists for that operation. Ids in the path name real rows of acme (a
made-up id would stop every request at the 404), so the generated bodies and queries reach
the handlers.

A second pass sends every body chunked (as gunicorn hands a ``Transfer-Encoding: chunked``
body to the application: no Content-Length, ``wsgi.input_terminated``), and puts a NUL
character into the path parameters of every other example.
"""

from __future__ import annotations

import io
import itertools

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance

from cairn.wsgi import application
from runtime.services.operations import operation_reserve
from tenants.services import Actor, token_issue
from tests.approvals_support import ask, at_review, draft

# Loading the document needs no database: the schema view has no authentication.
schema = schemathesis.openapi.from_wsgi("/api/v1/schema?format=json", application)


def chunked(app):  # noqa: ANN001, ANN201
    """The WSGI environ a chunked request gets from gunicorn: the decoded body readable to
    its end, no Content-Length, and the server's word that the input is terminated."""

    def call(environ, start_response):  # noqa: ANN001, ANN202
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length:
            body = environ["wsgi.input"].read(length)
            environ = {
                **environ,
                "wsgi.input": io.BytesIO(body),
                "wsgi.input_terminated": True,
                "HTTP_TRANSFER_ENCODING": "chunked",
            }
            del environ["CONTENT_LENGTH"]
        return app(environ, start_response)

    return call


chunked_schema = schemathesis.openapi.from_wsgi("/api/v1/schema?format=json", chunked(application))
_examples = itertools.count()


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


@pytest.mark.django_db
@chunked_schema.parametrize()
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_chunked_body_or_nul_in_a_path_breaks_the_api(case, admin_token, known_rows):  # noqa: ANN001
    nul = next(_examples) % 2 == 1
    for name in case.path_parameters or {}:
        value = known_rows.get(name, str(case.path_parameters[name]))
        case.path_parameters[name] = f"{value[:4]}\x00{value[4:]}" if nul else value
    response = case.call_and_validate(
        headers={"Authorization": f"Bearer {admin_token}"},
        checks=[not_a_server_error, status_code_conformance],
    )
    if nul and case.path_parameters:
        assert response.status_code == 400 and "NUL" in response.json()["detail"], response.text
