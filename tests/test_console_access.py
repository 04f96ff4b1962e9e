"""Console foundation: sign-in, the role-filtered menu, tenant switching, CSP-safe layout."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from tenants.selectors import SESSION_TENANT_KEY
from tenants.services import Actor, member_set_role


def client_for(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


def nav_labels(html: str) -> list[str]:
    nav = re.search(r'<nav class="site-nav".*?</nav>', html, re.S).group(0)
    return re.findall(r"<a [^>]*>([^<]+)</a>", nav)


@pytest.mark.django_db
def test_an_anonymous_visitor_is_sent_to_the_login_page():
    response = Client().get(reverse("console:runs"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("console:login") + "?next=")


@pytest.mark.django_db
def test_an_anonymous_htmx_poll_redirects_the_whole_page():
    response = Client().get(
        reverse("console:runs"), HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="/runs/?status=x"
    )
    assert response.status_code == 200
    assert response["HX-Redirect"].startswith(reverse("console:login") + "?next=")


def test_signing_in_through_the_form_lands_an_operator_on_the_runs(bob):
    client = Client()
    page = client.get(reverse("console:login"))
    assert b'<label for="id_username">Username</label>' in page.content
    response = client.post(
        reverse("console:login"),
        {"username": "bob", "password": "correct horse battery staple"},
        follow=True,
    )
    assert response.redirect_chain[-1][0] == reverse("console:runs")


def test_a_wrong_password_is_refused_with_a_sentence(bob):
    response = Client().post(reverse("console:login"), {"username": "bob", "password": "no"})
    assert response.status_code == 200
    assert b"did not match" in response.content


def test_signing_out_ends_the_session(bob):
    client = client_for(bob)
    response = client.post(reverse("console:logout"))
    assert response.status_code == 302
    assert client.get(reverse("console:runs")).status_code == 302


ADMIN_ONLY = {"Members", "Retention"}


def test_the_menu_shows_an_admin_everything(alice):  # noqa: ANN001
    labels = nav_labels(
        client_for(alice).get(reverse("console:home"), follow=True).content.decode()
    )
    assert {"Runs", "Approvals", "Health"} <= set(labels)


def test_the_menu_shows_an_operator_the_runs_health_and_the_audit_log(bob):  # noqa: ANN001
    labels = nav_labels(client_for(bob).get(reverse("console:home"), follow=True).content.decode())
    # every member mints their own tokens
    assert labels == ["Runs", "Health", "Audit log", "API tokens"]


def test_the_menu_shows_a_reviewer_the_approvals_only(carol):  # noqa: ANN001
    labels = nav_labels(
        client_for(carol).get(reverse("console:home"), follow=True).content.decode()
    )
    assert labels == ["Approvals", "API tokens"]


def test_no_admin_entry_is_shown_below_admin(bob, carol):  # noqa: ANN001
    for user in (bob, carol):
        html = client_for(user).get(reverse("console:home"), follow=True).content.decode()
        assert not ADMIN_ONLY & set(nav_labels(html))


def test_a_reviewer_lands_on_the_review_queue_not_the_runs(carol):
    response = client_for(carol).get(reverse("console:home"))
    assert response.status_code == 302
    assert response.url == reverse("approvals:inbox")
    assert client_for(carol).get(reverse("console:runs")).status_code == 403


def test_a_user_without_any_tenant_is_refused(db):  # noqa: ANN001
    from tests.factories import UserFactory

    response = client_for(UserFactory(username="nobody")).get(reverse("console:runs"))
    assert response.status_code == 403


def test_the_health_page_opens_for_an_operator_and_an_admin_not_a_reviewer(alice, bob, carol):  # noqa: ANN001
    assert client_for(bob).get(reverse("console:health")).status_code == 200
    assert client_for(alice).get(reverse("console:health")).status_code == 200
    assert client_for(carol).get(reverse("console:health")).status_code == 403


def test_the_layout_carries_csrf_in_hx_headers_and_no_inline_script_or_style(alice):
    html = client_for(alice).get(reverse("console:runs")).content.decode()
    assert re.search(r"<body hx-headers='\{\"X-CSRFToken\": \"\w{32,}\"\}'>", html)
    assert "django_htmx/htmx-2.min.js" in html
    for tag in re.findall(r"<script[^>]*>", html):
        assert "src=" in tag, tag
    assert "<style" not in html
    assert " style=" not in html


def test_the_vendored_htmx_and_css_are_served_by_the_app(alice, live_server):  # noqa: ANN001
    import urllib.request

    for path in ("/static/django_htmx/htmx-2.min.js", "/static/cairn/console.css"):
        with urllib.request.urlopen(live_server.url + path) as response:  # noqa: S310
            assert response.status == 200
            assert len(response.read()) > 1000


def test_a_member_of_two_tenants_switches_between_them(alice, globex):  # noqa: ANN001
    member_set_role(tenant=globex, user=alice, role="operator", actor=Actor.system("test"))
    client = client_for(alice)
    html = client.get(reverse("console:runs")).content.decode()
    assert 'id="tenant-select"' in html
    response = client.post(reverse("console:tenant_switch"), {"tenant": str(globex.pk)})
    assert response.status_code == 302
    assert client.session[SESSION_TENANT_KEY] == str(globex.pk)
    # In globex alice is an operator only: the admin pages are now refused.
    assert client.get(reverse("console:retention")).status_code == 403


def test_switching_to_a_tenant_one_is_not_a_member_of_is_refused(alice, globex):  # noqa: ANN001
    client = client_for(alice)
    response = client.post(reverse("console:tenant_switch"), {"tenant": str(globex.pk)})
    assert response.status_code == 404
    assert SESSION_TENANT_KEY not in client.session


def test_the_csp_header_is_sent_on_console_pages(bob):
    response = client_for(bob).get(reverse("console:runs"))
    assert "script-src 'self'" in response["Content-Security-Policy"]


@pytest.mark.parametrize("value", ["not-a-uuid", "", "1", "0" * 40])
def test_switching_to_something_that_is_not_a_tenant_id_is_refused_like_a_stranger(alice, value):  # noqa: ANN001
    client = client_for(alice)
    response = client.post(reverse("console:tenant_switch"), {"tenant": value})
    assert response.status_code == 404
    assert SESSION_TENANT_KEY not in client.session
