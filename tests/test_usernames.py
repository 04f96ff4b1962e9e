"""A username means one account however it is typed: NFKC and case-folded (``Bob``,
``ＢＯＢ``, ``𝐛𝐨𝐛`` are bob). Invitations, new accounts, the owner of a new tenant and
sign-in all resolve it the same way, so no look-alike account is ever made beside an
existing one."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from cairn.errors import AlreadyMember
from tenants.members import invitation_accept_new, invitation_open, member_invite
from tenants.models import MemberInvitation
from tenants.services import Actor, tenant_create
from tenants.usernames import account_find, username_key

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery staple"
LOOK_ALIKES = ["Bob", "BOB", "ｂｏｂ", "𝐛𝐨𝐛", " bob"]


@pytest.mark.parametrize("spelling", LOOK_ALIKES)
def test_inviting_a_look_alike_of_an_existing_member_is_refused(acme, alice, bob, spelling):  # noqa: ANN001
    with pytest.raises(AlreadyMember):
        member_invite(tenant=acme, username=spelling, role="reviewer", actor=Actor(user=alice))
    assert not MemberInvitation.objects.exists()


@pytest.mark.parametrize("spelling", LOOK_ALIKES)
def test_the_members_page_refuses_it_with_a_sentence(client, acme, alice, bob, spelling):  # noqa: ANN001
    client.force_login(alice)
    answer = client.post("/members/invite", {"username": spelling, "role": "reviewer", "email": ""})
    assert "already a member" in answer.content.decode()
    assert not MemberInvitation.objects.exists()


def test_a_look_alike_of_an_account_elsewhere_invites_that_account_never_a_second(
    acme, globex, alice, charlie
):  # noqa: ANN001
    users = get_user_model().objects
    first = member_invite(tenant=acme, username="Dave", role="reviewer", actor=Actor(user=alice))
    assert first.username == "dave"
    assert invitation_accept_new(invitation=_opened(first), password=PASSWORD)
    dave = users.get(username="dave")
    count = users.count()
    # globex invites ＤＡＶＥ: the invitation is dave's, to accept by signing in; choosing a
    # password through it makes no second account.
    second = member_invite(
        tenant=globex, username="ＤＡＶＥ", role="reviewer", actor=Actor(user=charlie)
    )
    assert second.username == "dave"
    assert not invitation_accept_new(invitation=_opened(second), password="x" * 12)
    assert users.count() == count and account_find("𝐃𝐚𝐯𝐞") == dave


def _opened(invitation):  # noqa: ANN001, ANN202
    """The open invitation its one-time link names."""
    parts = invitation.link_path.strip("/").split("/")
    return invitation_open(invitation_id=parts[1], token=parts[2])


def test_a_new_tenants_owner_is_found_by_any_spelling(db):  # noqa: ANN001
    tenant_create(slug="one", owner_username="Erin")
    tenant_create(slug="two", owner_username="ＥＲＩＮ")
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["erin"]


def test_sign_in_finds_the_account_by_its_key(bob):  # noqa: ANN001
    for spelling in ("Bob", "ｂｏｂ"):
        client = Client()
        answer = client.post("/login/", {"username": spelling, "password": PASSWORD})
        assert answer.status_code == 302, spelling
        assert int(client.session["_auth_user_id"]) == bob.pk


def test_the_key_is_nfkc_case_folded():
    assert username_key("𝐀𝐫𝐞𝐯") == username_key("ＡＲＥＶ") == username_key(" arev ") == "arev"
    assert username_key("Straße") == "strasse"
