"""The members page: invite with a one-time set-password link, roles, removal, API tokens.
Every change goes through a service that writes its audit event."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from tenants import roles
from tenants.members import member_password_link
from tenants.models import ApiToken, AuditEvent
from tenants.services import Actor, member_set_role, permissions_of, token_issue
from tests.markup_support import markup_problems

User = get_user_model()
MEMBERS = "/members/"


def client_for(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin(alice) -> Client:  # noqa: ANN001
    return client_for(alice)


def events(tenant, action):  # noqa: ANN001, ANN201
    return list(AuditEvent.objects.filter(tenant=tenant, action=action).order_by("id"))


def test_the_members_page_lists_each_member_with_role_and_is_for_admins_only(
    admin, alice, bob, carol
):  # noqa: ANN001
    response = admin.get(MEMBERS)
    assert response.status_code == 200
    html = response.content.decode()
    for user, role in ((alice, "admin"), (bob, "operator"), (carol, "reviewer")):
        row = re.search(rf'<tr id="member-{user.pk}".*?</tr>', html, re.S).group(0)
        assert re.search(rf'<option value="{role}" selected>', row), user
    assert client_for(bob).get(MEMBERS).status_code == 403
    assert client_for(carol).get(MEMBERS).status_code == 403


def test_the_menu_offers_members_and_the_audit_log_to_admins(admin):  # noqa: ANN001
    html = admin.get("/", follow=True).content.decode()
    assert 'href="/members/"' in html
    assert 'href="/audit/"' in html


# --- inviting ----------------------------------------------------------------------------
def invite_link(response) -> str:  # noqa: ANN001
    link = re.search(
        r'<code id="invite-link" class="secret">([^<]+)</code>', response.content.decode()
    )
    assert link, "the link is shown"
    return link.group(1)


def test_an_invitation_of_a_new_username_joins_when_they_choose_a_password(admin, acme):  # noqa: ANN001
    response = admin.post(
        f"{MEMBERS}invite", {"username": "dave", "email": "dave@example.org", "role": "operator"}
    )
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    link = invite_link(response)
    # Nothing exists or is granted before dave answers.
    assert not User.objects.filter(username="dave").exists()
    # Shown once: the page does not show it again, but lists the open invitation.
    page = admin.get(MEMBERS).content.decode()
    assert "invite-link" not in page and 'id="invitations"' in page and ">dave<" in page

    visitor = Client()
    form = visitor.get(link)
    assert b"Choose this password and join" in form.content
    assert markup_problems(form.content.decode()) == []
    mismatch = visitor.post(link, {"new_password1": "a", "new_password2": "b"})
    assert mismatch.status_code == 400
    assert markup_problems(mismatch.content.decode()) == []
    done = visitor.post(
        link, {"new_password1": "a long new passphrase", "new_password2": "a long new passphrase"}
    )
    assert done.status_code == 200 and b"its password is set" in done.content
    assert visitor.login(username="dave", password="a long new passphrase")
    dave = User.objects.get(username="dave")
    assert permissions_of(user=dave, tenant=acme) == {roles.OPERATE}
    assert dave.email == "dave@example.org"
    again = Client().get(link)
    assert b"This link no longer works" in again.content
    assert [e.target for e in events(acme, "member.invited")] == ["dave"]
    assert events(acme, "member.role_set")[-1].details == {"role": "operator"}
    assert [e.target for e in events(acme, "member.joined")] == ["dave"]
    assert [e.target for e in events(acme, "member.password_set")] == ["dave"]


def test_inviting_a_member_twice_is_refused(admin, bob):  # noqa: ANN001
    response = admin.post(f"{MEMBERS}invite", {"username": "bob", "role": "reviewer"})
    assert response.status_code == 409
    # The sentence stands in the invite form it refuses, which keeps what was typed.
    form = re.search(
        r'<form [^>]*action="/members/invite".*?</form>', response.content.decode(), re.S
    )
    assert "already a member" in form.group(0)
    assert 'value="bob"' in form.group(0)
    bob.refresh_from_db()


def test_an_account_of_another_tenant_joins_only_when_its_holder_accepts(admin, acme, charlie):  # noqa: ANN001
    response = admin.post(f"{MEMBERS}invite", {"username": "charlie", "role": "reviewer"})
    assert response.status_code == 200
    html = response.content.decode()
    # Nothing says where else the account belongs, or whether it has a password.
    assert "globex" not in html and "password already" not in html
    assert permissions_of(user=charlie, tenant=acme) == frozenset()
    link = invite_link(response)
    # The link cannot enrol charlie for him: neither the admin who holds it, nor a
    # password chosen through it (charlie's own password is untouched).
    assert admin.post(link, {"answer": "accept"}).status_code == 400  # a password form
    taken = Client().post(
        link, {"new_password1": "x-chosen-by-admin", "new_password2": "x-chosen-by-admin"}
    )
    assert taken.status_code == 200
    assert permissions_of(user=charlie, tenant=acme) == frozenset()
    assert not Client().login(username="charlie", password="x-chosen-by-admin")
    # Charlie signs in and accepts.
    holder = client_for(charlie)
    page = holder.get(link).content.decode()
    assert "Accept" in page and "Decline" in page
    assert holder.post(link, {"answer": "accept"}).status_code == 200
    assert permissions_of(user=charlie, tenant=acme) == {roles.REVIEW}
    assert [e.actor for e in events(acme, "member.joined")] == [charlie]
    assert b"This link no longer works" in holder.get(link).content


def test_a_declined_invitation_grants_nothing(admin, acme, charlie):  # noqa: ANN001
    link = invite_link(admin.post(f"{MEMBERS}invite", {"username": "charlie", "role": "admin"}))
    holder = client_for(charlie)
    assert holder.post(link, {"answer": "decline"}).status_code == 200
    assert permissions_of(user=charlie, tenant=acme) == frozenset()
    assert b"This link no longer works" in holder.post(link, {"answer": "accept"}).content
    assert permissions_of(user=charlie, tenant=acme) == frozenset()
    assert [e.target for e in events(acme, "member.declined")] == ["charlie"]


def test_the_invite_answer_is_the_same_whether_or_not_the_username_exists(admin, charlie):  # noqa: ANN001
    def answer(username: str) -> tuple:
        response = admin.post(f"{MEMBERS}invite", {"username": username, "role": "reviewer"})
        html = re.sub(r"[A-Za-z0-9]{64}", "CSRF", response.content.decode())
        html = re.sub(r'<code id="invite-link" class="secret">[^<]+</code>', "LINK", html)
        said = re.search(r'<section class="card shown-once".*?</section>', html, re.S).group(0)
        members = re.search(r'<table id="members">.*?</table>', html, re.S).group(0)
        return response.status_code, said.replace(username, "NAME"), members

    assert answer("charlie") == answer("nobody-has-this-name")
    # The link page too looks the same to whoever opens it.
    first = admin.post(f"{MEMBERS}invite", {"username": "charlie", "role": "operator"})
    second = admin.post(f"{MEMBERS}invite", {"username": "zed", "role": "operator"})
    pages = [
        re.sub(r"[A-Za-z0-9]{64}", "CSRF", Client().get(invite_link(r)).content.decode())
        .replace(invite_link(r).split("testserver")[-1], "LINK")
        .replace(name, "NAME")
        for r, name in ((first, "charlie"), (second, "zed"))
    ]
    assert pages[0] == pages[1]


def test_no_admin_can_mint_a_password_link_for_an_account_others_rely_on(acme, globex, alice):  # noqa: ANN001
    # Invited by globex, password not yet set, then invited here too.
    shared = User.objects.create(username="erin")
    shared.set_unusable_password()
    shared.save()
    member_set_role(tenant=globex, user=shared, role="reviewer", actor=Actor.system("t"))
    member_set_role(tenant=acme, user=shared, role="reviewer", actor=Actor.system("t"))
    from cairn.errors import InvalidRequest

    with pytest.raises(InvalidRequest):
        member_password_link(tenant=acme, user=shared, actor=Actor(user=alice))


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"username": "", "role": "operator"}, "username"),
        ({"username": "no spaces", "role": "operator"}, "username"),
        ({"username": "x", "role": "owner"}, "role"),
        ({"username": "x", "role": "one_run"}, "run"),
    ],
)
def test_an_incomplete_invitation_is_refused_field_by_field(admin, data, field):  # noqa: ANN001
    response = admin.post(f"{MEMBERS}invite", data)
    assert response.status_code == 400
    assert f'id="invite_{field}_error"'.encode() in response.content
    assert markup_problems(response.content.decode()) == []
    assert not User.objects.filter(username="x").exists()


# --- roles and removal ----------------------------------------------------------------------
def test_an_admin_changes_a_role_and_the_change_is_audited(admin, acme, bob):  # noqa: ANN001
    response = admin.post(f"{MEMBERS}{bob.pk}/role", {"role": "reviewer"})
    assert response.status_code == 302
    assert permissions_of(user=bob, tenant=acme) == {roles.REVIEW}
    event = events(acme, "member.role_set")[-1]
    assert (event.actor_label, event.target, event.details) == (
        "alice",
        "bob",
        {"role": "reviewer"},
    )


def test_an_htmx_role_change_answers_with_the_members_section(admin, bob):  # noqa: ANN001
    response = admin.post(f"{MEMBERS}{bob.pk}/role", {"role": "admin"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="members-section"')
    assert "bob is now admin." in html


def test_the_last_admin_cannot_step_down_or_be_removed(admin, acme, alice):  # noqa: ANN001
    for url, data in (
        (f"{MEMBERS}{alice.pk}/role", {"role": "operator"}),
        (f"{MEMBERS}{alice.pk}/remove", {}),
    ):
        response = admin.post(url, data)
        assert response.status_code == 409
        assert b"only admin" in response.content
    assert roles.ADMIN in permissions_of(user=alice, tenant=acme)


def section_of(response) -> str:  # noqa: ANN001
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="members-section"'), html[:200]
    assert html.rstrip().endswith("</section>")
    return html


@pytest.mark.parametrize(
    ("path", "data"), [("role", {"role": "operator"}), ("remove", {}), ("role", {"role": "x"})]
)
def test_an_htmx_refusal_answers_with_the_section_saying_why_and_the_real_role(
    admin, acme, alice, path, data
):  # noqa: ANN001
    response = admin.post(f"{MEMBERS}{alice.pk}/{path}", data, HTTP_HX_REQUEST="true")
    assert response.status_code == (400 if data.get("role") == "x" else 409)
    html = section_of(response)
    refusal = re.search(r'<p class="error" role="alert" id="refusal">([^<]+)</p>', html)
    assert refusal, "the sentence is inside the swapped section"
    expected = "Choose one of the roles." if data.get("role") == "x" else "only admin"
    assert expected in refusal.group(1)
    row = re.search(rf'<tr id="member-{alice.pk}".*?</tr>', html, re.S).group(0)
    assert re.findall(r"<option [^>]*selected>", row) == ['<option value="admin" selected>']
    assert roles.ADMIN in permissions_of(user=alice, tenant=acme)


def test_a_refusal_on_the_whole_page_stands_in_the_members_section(admin, alice):  # noqa: ANN001
    response = admin.post(f"{MEMBERS}{alice.pk}/remove")
    assert response.status_code == 409
    section = re.search(
        r'<section id="members-section".*?</section>', response.content.decode(), re.S
    ).group(0)
    assert 'id="refusal"' in section and "only admin" in section


def test_every_id_on_the_members_page_is_unique_and_each_label_names_its_own_field(
    admin, alice, carol, run
):  # noqa: ANN001
    from tenants.grants import run_grant_create

    run_grant_create(tenant=run.tenant, run_id=run.pk, user=carol, actor=Actor(user=alice))
    token_issue(tenant=run.tenant, user=carol, actor=Actor.system("t"))
    pages = [
        admin.get(MEMBERS),
        admin.post(f"{MEMBERS}invite", {"username": "no spaces", "role": "one_run"}),
        admin.post(f"{MEMBERS}grants", {"username": "", "run": "x"}),
        admin.post(f"{MEMBERS}{alice.pk}/tokens", {"name": "x" * 101}),
    ]
    for response in pages:
        html = response.content.decode()
        assert markup_problems(html) == [], response.request["PATH_INFO"]
    html = pages[0].content.decode()
    for form, prefix in (("invite", "invite"), ("grants", "grant")):
        fields = re.search(rf'<form [^>]*action="/members/{form}".*?</form>', html, re.S).group(0)
        assert f'<label for="{prefix}_username">' in fields
        assert f'id="{prefix}_username"' in fields
        assert f'id="{prefix}_run"' in fields


def test_removing_a_member_stops_their_token_at_once(admin, acme, bob, api_as, run):  # noqa: ANN001
    api = api_as(bob, acme)
    assert api.get(f"/api/v1/runs/{run.pk}").status_code == 200
    assert admin.post(f"{MEMBERS}{bob.pk}/remove").status_code == 302
    assert api.get(f"/api/v1/runs/{run.pk}").status_code == 401
    assert permissions_of(user=bob, tenant=acme) == frozenset()
    assert not ApiToken.objects.filter(user=bob, revoked_at__isnull=True).exists()
    assert [e.target for e in events(acme, "member.removed")] == ["bob"]


def test_a_removed_members_token_fails_even_before_it_is_marked_revoked(acme, bob, api_as, run):  # noqa: ANN001
    api = api_as(bob, acme)
    # The role rows alone going away (as a raw delete would do) is enough.
    from tenants.models import TenantUserObjectPermission

    TenantUserObjectPermission.objects.filter(user=bob).delete()
    assert api.get(f"/api/v1/runs/{run.pk}").status_code == 401


def test_an_admin_of_another_tenant_cannot_touch_acmes_members(charlie, bob, acme):  # noqa: ANN001
    outsider = client_for(charlie)
    assert outsider.post(f"{MEMBERS}{bob.pk}/role", {"role": "admin"}).status_code == 404
    assert outsider.post(f"{MEMBERS}{bob.pk}/remove").status_code == 404
    assert outsider.post(f"{MEMBERS}{bob.pk}/tokens", {"name": "x"}).status_code == 404
    assert permissions_of(user=bob, tenant=acme) == {roles.OPERATE}


# --- tokens --------------------------------------------------------------------------------
def test_a_token_is_minted_only_by_its_owner(admin, acme, alice, carol):  # noqa: ANN001
    refused = admin.post(f"{MEMBERS}{carol.pk}/tokens", {"name": "in carol's name"})
    assert refused.status_code == 403
    assert "minted by its owner" in refused.content.decode()
    assert not ApiToken.objects.filter(user=carol).exists()
    from tenants.services import TokenNotYours

    with pytest.raises(TokenNotYours):
        token_issue(tenant=acme, user=carol, actor=Actor(user=alice))
    # Carol mints her own on her tokens page; an admin's own row keeps its form.
    own = client_for(carol).post("/account/tokens/", {"name": "mine"})
    assert own.status_code == 200 and b'id="token-secret"' in own.content
    assert ApiToken.objects.filter(user=carol, name="mine").exists()
    page = admin.get(MEMBERS).content.decode()
    assert f"/members/{carol.pk}/tokens" not in page and f"/members/{alice.pk}/tokens" in page


def test_a_token_is_shown_once_stored_hashed_and_shows_when_it_was_last_used(admin, acme, alice):  # noqa: ANN001
    carol = alice  # an admin mints their own token on the members page
    response = admin.post(f"{MEMBERS}{carol.pk}/tokens", {"name": "laptop"})
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    secret = re.search(
        r'<code id="token-secret" class="secret">([^<]+)</code>', response.content.decode()
    ).group(1)
    token = ApiToken.objects.get(user=carol, name="laptop")
    assert token.key_sha256 == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in str(list(ApiToken.objects.values()))
    assert secret not in str(list(AuditEvent.objects.values()))
    page = admin.get(MEMBERS).content.decode()
    assert secret not in page
    assert "never used" in page

    api = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.get("/api/v1/approvals").status_code == 200
    assert "last used" in admin.get(MEMBERS).content.decode()
    assert events(acme, "token.issued")[-1].target.endswith("for alice")


def test_revoking_a_token_stops_it_with_the_next_request(admin, acme, carol):  # noqa: ANN001
    token, secret = token_issue(tenant=acme, user=carol, actor=Actor.system("t"))
    api = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.get("/api/v1/approvals").status_code == 200
    response = admin.post(f"{MEMBERS}tokens/{token.pk}/revoke", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert api.get("/api/v1/approvals").status_code == 401
    assert [e.target for e in events(acme, "token.revoked")] == [f"{token.prefix}… of carol"]
    # Revoking twice records nothing new.
    admin.post(f"{MEMBERS}tokens/{token.pk}/revoke")
    assert len(events(acme, "token.revoked")) == 1


def test_another_tenants_token_cannot_be_revoked_from_here(admin, globex, charlie):  # noqa: ANN001
    token, secret = token_issue(tenant=globex, user=charlie, actor=Actor.system("t"))
    assert admin.post(f"{MEMBERS}tokens/{token.pk}/revoke").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


def test_a_token_is_only_issued_to_members(acme, charlie):  # noqa: ANN001
    from cairn.errors import InvalidRequest

    with pytest.raises(InvalidRequest):
        token_issue(tenant=acme, user=charlie, actor=Actor.system("t"))


def test_every_members_form_carries_a_csrf_token(admin, bob):  # noqa: ANN001
    html = admin.get(MEMBERS).content.decode()
    forms = re.findall(r"<form [^>]*method=\"post\".*?</form>", html, re.S)
    assert len(forms) >= 8
    assert all("csrfmiddlewaretoken" in form for form in forms)
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(bob)
    assert csrf_client.post(f"{MEMBERS}{bob.pk}/role", {"role": "admin"}).status_code == 403
    assert reverse("tenants:members") == MEMBERS
