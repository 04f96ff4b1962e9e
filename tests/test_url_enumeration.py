"""Every URL of the project, walked from the resolver, with real rows of tenant acme in its
path: an outsider (charlie, admin of globex) gets 404 for acme's rows; a member without the
role gets 403; an anonymous caller gets 401 (API) or the sign-in page (console).

REQUIRED names who may use each URL. A URL missing from it fails the test: nobody adds a
page or an endpoint without deciding who may see it.
"""

from __future__ import annotations

import pytest
from django.test import Client

from tenants.models import AuditEvent
from tests.acme_rows_support import ROW_PARAMS, api_client, send, web_client
from tests.security_support import WRITE_METHODS, Route, served_methods, walk

PUBLIC = "public"  # anyone, signed in or not
SIGNED_IN = "signed in"  # any signed-in user; rows looked up among their own tenants
MEMBER = "member"  # any role in the current tenant
REVIEWER = "reviewer"  # the review role, or a run grant (rows narrowed to granted runs)
OPERATOR = "operator"
ADMIN = "admin"
STAFF = "django staff"  # Django's admin site: is_staff only; tenant roles give nothing
# Prometheus scrapes: CAIRN_METRICS_TOKEN or CAIRN_METRICS_ALLOWED_NETWORKS, never a session.
METRICS = "metrics token or allowed network"

REQUIRED: dict[str, str] = {
    "api:schema": PUBLIC,
    "api:workflows": OPERATOR,
    "api:workflow-version": OPERATOR,
    "api:runs": OPERATOR,
    "api:run": OPERATOR,
    "api:checkpoints": OPERATOR,
    "api:checkpoint": OPERATOR,
    "api:run-verify": OPERATOR,
    "api:run-next": OPERATOR,
    "api:webhook": ADMIN,
    "api:webhook-secret": ADMIN,
    "api:run-lease": OPERATOR,
    "api:run-operations": OPERATOR,
    "api:run-operation": OPERATOR,
    "api:run-operation-confirm": OPERATOR,
    "api:run-operation-fail": OPERATOR,
    "api:run-operation-unknown": OPERATOR,
    "api:run-operation-job": OPERATOR,
    "api:run-resume": OPERATOR,
    "api:run-pause": OPERATOR,
    "api:run-unpause": OPERATOR,
    "api:run-cancel": OPERATOR,
    "api:run-retry": OPERATOR,
    "api:run-fork": OPERATOR,
    "api:run-fork-preview": OPERATOR,
    "api:run-grant-budget": OPERATOR,
    "api:bulk-actions": OPERATOR,
    "api:bulk-action": OPERATOR,
    "api:bulk-action-refusals": OPERATOR,
    "api:artifacts": OPERATOR,
    "api:artifact": OPERATOR,
    "api:artifact-content": OPERATOR,
    "approvals_api:run-approvals": OPERATOR,
    "approvals_api:approvals": REVIEWER,
    "approvals_api:approval": REVIEWER,
    "approvals_api:approval-decision": REVIEWER,
    "approvals_api:approval-artifact": REVIEWER,
    "approvals_api:run-evidence": OPERATOR,
    "approvals_api:evidence-public-key": PUBLIC,  # a public key: anyone may verify
    "approvals:inbox": REVIEWER,
    "approvals:review": REVIEWER,
    "approvals:source": REVIEWER,
    "approvals:decide": REVIEWER,
    "approvals:status": REVIEWER,
    "tenants:members": ADMIN,
    "tenants:invite": ADMIN,
    "tenants:set_role": ADMIN,
    "tenants:remove": ADMIN,
    "tenants:password_link": ADMIN,
    "tenants:issue_token": ADMIN,
    "tenants:revoke_token": ADMIN,
    "tenants:grant": ADMIN,
    "tenants:revoke_grant": ADMIN,
    "tenants:reviewer_groups": ADMIN,
    "tenants:reviewer_group_create": ADMIN,
    "tenants:reviewer_group_delete": ADMIN,
    "tenants:reviewer_group_add": ADMIN,
    "tenants:reviewer_group_remove": ADMIN,
    "api:reviewer-groups": ADMIN,
    "api:reviewer-group": ADMIN,
    "api:reviewer-group-members": ADMIN,
    "api:reviewer-group-member": ADMIN,
    "tenants:audit": OPERATOR,
    "tenants:audit_csv": OPERATOR,
    "tenants:audit_jsonl": OPERATOR,
    "tenants:set_password": PUBLIC,  # the one-time token in the link is the credential
    "tenants:set_password_done": PUBLIC,
    "tenants:invitation": PUBLIC,  # the one-time token in the link, and then the invitee's sign-in
    "tenants:my_tokens": MEMBER,  # one's own tokens in the current tenant
    "console:home": MEMBER,
    "console:login": PUBLIC,
    "console:logout": PUBLIC,
    "console:tenant_switch": SIGNED_IN,
    "console:runs": OPERATOR,
    "console:run_rows": OPERATOR,
    "console:run_counts": OPERATOR,
    "console:run_detail": OPERATOR,
    "console:run_snapshot": OPERATOR,
    "console:run_action": OPERATOR,
    "console:operation_outcome": OPERATOR,
    "console:artifact_view": OPERATOR,
    "console:operation_view": OPERATOR,
    "console:checkpoint_detail": OPERATOR,
    "console:evidence_download": OPERATOR,
    "console:health": OPERATOR,
    "console:run_start": OPERATOR,
    "console:bulk_new": OPERATOR,
    "console:bulk_history": OPERATOR,
    "console:bulk_detail": OPERATOR,
    "console:bulk_progress": OPERATOR,
    "approvals:mine": REVIEWER,
    "approvals:notifications": REVIEWER,  # one's own preferences
    "approvals:delegations": REVIEWER,  # one's own delegations
    "approvals:delegation_end": REVIEWER,
    "approvals_api:delegations": REVIEWER,
    "approvals_api:delegation": REVIEWER,
    "approvals_api:notification-preferences": REVIEWER,
    "console:retention": ADMIN,
    "console:retention_preview": ADMIN,
    "console:retention_remove": ADMIN,
    "console:retention_hold": ADMIN,
    "metrics": METRICS,
}
NAMESPACE_REQUIRED = {"admin": STAFF}

# Members of acme who lack each role (the run-grant holder dave lacks every tenant role).
LACKING = {
    REVIEWER: ("bob",),
    OPERATOR: ("carol", "dave"),
    ADMIN: ("bob", "carol", "dave"),
    MEMBER: ("nobody",),
}
# Routes that name an acme row in the body rather than the path: charlie's request must
# change nothing of acme's (checked at the end), and answer this status where one is given.
BODY_ROWS: dict[str, int | None] = {
    "console:tenant_switch": 404,
    "console:retention_hold": None,  # refused with a message on the page, like a typo'd id
}


def required_role(route: Route) -> str | None:
    if route.name in REQUIRED:
        return REQUIRED[route.name]
    return NAMESPACE_REQUIRED.get(route.name.split(":", 1)[0])


def project_routes() -> list[Route]:
    return [route for route in walk() if not route.name.startswith("admin:")]


# --- the table -----------------------------------------------------------------------------
def test_every_url_has_a_required_role():
    missing = [route.name for route in walk() if required_role(route) is None]
    assert not missing, (
        f"These URLs have no entry in REQUIRED: {missing}. Decide who may use each one and "
        "add it to the table in tests/test_url_enumeration.py."
    )
    stale = set(REQUIRED) - {route.name for route in walk()}
    assert not stale, f"REQUIRED names URLs that no longer exist: {sorted(stale)}"


def test_every_path_parameter_can_be_filled(acme_rows):  # noqa: ANN001
    unknown = {
        (route.name, param)
        for route in project_routes()
        for param in route.params
        if param not in acme_rows.values
    }
    assert not unknown, f"Add a real acme value for these path parameters: {sorted(unknown)}"


# --- (c) anonymous ----------------------------------------------------------------------------
def test_an_anonymous_caller_gets_401_from_the_api_and_the_sign_in_page_from_the_console(
    acme_rows,
):  # noqa: ANN001
    problems = []
    for route in project_routes():
        role = required_role(route)
        for method in served_methods(route.callback):
            if role == METRICS:
                response = send(Client(REMOTE_ADDR="192.0.2.1"), route, method, acme_rows)
                if response.status_code != 403:
                    problems.append((route.name, method, response.status_code))
                continue
            response = send(Client(), route, method, acme_rows)
            if role == PUBLIC:
                if response.status_code >= 500:
                    problems.append((route.name, method, response.status_code))
            elif route.is_api:
                if response.status_code != 401 or response.json()["code"] != "not_authenticated":
                    problems.append((route.name, method, response.status_code))
            elif response.status_code != 302 or not response["Location"].startswith("/login/"):
                problems.append((route.name, method, response.status_code))
    assert not problems, f"anonymous callers were not refused: {problems}"


def test_the_django_admin_is_for_staff_only_never_for_tenant_admins(alice, charlie):  # noqa: ANN001
    for client in (Client(), web_client(alice), web_client(charlie)):
        response = client.get("/admin/")
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")


# --- (b) a member without the role ------------------------------------------------------------
@pytest.mark.parametrize("role", [REVIEWER, OPERATOR, ADMIN, MEMBER])
def test_a_member_without_the_role_gets_403(acme_rows, acme, django_user_model, role):  # noqa: ANN001
    from django.contrib.auth import get_user_model

    users = {u.username: u for u in get_user_model().objects.filter(username__in=LACKING[role])}
    problems = []
    checked = 0
    for route in project_routes():
        if required_role(route) != role:
            continue
        for username in LACKING[role]:
            user = users[username]
            for method in served_methods(route.callback):
                if route.is_api:
                    if username == "nobody":
                        continue  # no tenant, so no token to call the API with
                    client = api_client(user, acme)
                else:
                    client = web_client(user)
                response = send(client, route, method, acme_rows)
                checked += 1
                if response.status_code != 403:
                    problems.append((route.name, method, username, response.status_code))
    assert checked, f"no URL requires {role}"
    assert not problems, f"members without the role were not refused with 403: {problems}"


# --- (a) an outsider ----------------------------------------------------------------------------
def test_an_admin_of_another_tenant_gets_404_for_every_acme_row(acme_rows, acme, globex, charlie):  # noqa: ANN001
    def acme_state() -> tuple:
        acme_rows.run.refresh_from_db()
        acme.refresh_from_db()
        run = acme_rows.run
        return (AuditEvent.objects.filter(tenant=acme).count(), run.version, run.legal_hold)

    before = acme_state()
    api, web = api_client(charlie, globex), web_client(charlie)
    problems = []
    for route in project_routes():
        role = required_role(route)
        if role in (PUBLIC, STAFF, METRICS):
            continue
        client = api if route.is_api else web
        has_rows = bool(ROW_PARAMS & set(route.params))
        for method in served_methods(route.callback):
            if route.name in BODY_ROWS and method == "POST":
                response = send(client, route, method, acme_rows)
                expected = BODY_ROWS[route.name]
                if expected is not None and response.status_code != expected:
                    problems.append((route.name, method, response.status_code))
                continue
            if not has_rows and method in WRITE_METHODS:
                continue  # writes his own tenant's rows (a new run of globex); nothing of acme's
            response = send(client, route, method, acme_rows)
            if has_rows:
                if response.status_code != 404:
                    problems.append((route.name, method, response.status_code))
                elif route.is_api and response.json()["code"] != "not_found":
                    problems.append((route.name, method, response.json()))
            else:
                body = (
                    b"".join(response.streaming_content) if response.streaming else response.content
                )
                leaked = [row for row in acme_rows.row_ids if row.encode() in body]
                if response.status_code >= 400 or leaked:
                    problems.append((route.name, method, response.status_code, leaked))
    assert not problems, f"acme's rows were not hidden from charlie: {problems}"
    assert acme_state() == before


# --- the control: the filled paths are real ------------------------------------------------------
def test_the_filled_paths_reach_real_rows_for_acmes_admin(acme_rows, acme, alice):  # noqa: ANN001
    """Without this, a 404 above could mean a wrong path rather than a refusal."""
    api, web = api_client(alice, acme), web_client(alice)
    problems = []
    for route in project_routes():
        skip = required_role(route) in (PUBLIC, STAFF, METRICS)
        if skip or "GET" not in served_methods(route.callback):
            continue
        response = send(api if route.is_api else web, route, "GET", acme_rows)
        if response.status_code in (401, 403, 404) or response.status_code >= 500:
            problems.append((route.name, response.status_code))
    assert not problems, f"acme's admin could not open these with acme's rows: {problems}"
