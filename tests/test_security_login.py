"""Sign-in throttling: too many failures for a username from one address (or from one
address altogether) refuse further attempts with a clear page until the window ends."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tenants.models import LoginThrottle

PASSWORD = "correct horse battery staple"


def attempt(username: str, password: str, ip: str = "198.51.100.1"):  # noqa: ANN201
    return Client(REMOTE_ADDR=ip).post("/login/", {"username": username, "password": password})


@pytest.fixture(autouse=True)
def _limits(settings):  # noqa: ANN001
    settings.CAIRN_LOGIN_MAX_FAILURES = 3
    settings.CAIRN_LOGIN_MAX_FAILURES_PER_ADDRESS = 10
    settings.CAIRN_LOGIN_WINDOW_SECONDS = 600


def fail(username: str, times: int, ip: str = "198.51.100.1") -> None:
    for _ in range(times):
        response = attempt(username, "wrong", ip)
        assert response.status_code == 200
        assert b"did not match" in response.content


def test_after_too_many_failures_even_the_right_password_is_refused_for_a_while(bob):  # noqa: ANN001
    fail("bob", 3)
    response = attempt("bob", PASSWORD)
    assert response.status_code == 429
    assert b"Too many failed sign-ins" in response.content
    assert b"Try again in 10 minutes" in response.content
    assert 590 <= int(response["Retry-After"]) <= 601
    assert "_auth_user_id" not in Client().session


def test_the_throttle_is_per_username_and_address(bob, carol):  # noqa: ANN001
    fail("bob", 3)
    assert attempt("bob", PASSWORD, ip="198.51.100.2").status_code == 302  # other address
    assert attempt("carol", PASSWORD).status_code == 302  # other user, same address
    # The username is matched case-insensitively, so BOB is bob.
    assert attempt("BOB", "wrong").status_code == 429


def test_a_success_clears_the_count(bob):  # noqa: ANN001
    fail("bob", 2)
    assert attempt("bob", PASSWORD).status_code == 302
    fail("bob", 2)
    assert attempt("bob", PASSWORD).status_code == 302


def test_the_refusal_ends_with_the_window(bob):  # noqa: ANN001
    fail("bob", 3)
    assert attempt("bob", PASSWORD).status_code == 429
    LoginThrottle.objects.update(window_started_at=timezone.now() - timedelta(seconds=601))
    assert attempt("bob", PASSWORD).status_code == 302


def test_one_address_trying_many_usernames_is_stopped_too(bob):  # noqa: ANN001
    for index in range(10):
        fail(f"guess{index}", 1)
    response = attempt("bob", PASSWORD)
    assert response.status_code == 429
    assert attempt("bob", PASSWORD, ip="198.51.100.3").status_code == 302


def test_the_counts_are_hashed_and_one_row_per_key(bob):  # noqa: ANN001
    fail("bob", 3)
    rows = list(LoginThrottle.objects.all())
    assert sorted(row.failures for row in rows) == [3, 3]
    assert all(len(row.key) == 64 and "bob" not in row.key for row in rows)


def test_a_refused_attempt_does_not_extend_the_window(bob):  # noqa: ANN001
    fail("bob", 3)
    before = {row.key: (row.failures, row.window_started_at) for row in LoginThrottle.objects.all()}
    for _ in range(5):
        assert attempt("bob", "wrong").status_code == 429
    after = {row.key: (row.failures, row.window_started_at) for row in LoginThrottle.objects.all()}
    assert after == before


def test_the_sign_in_form_still_needs_its_csrf_token(bob):  # noqa: ANN001
    client = Client(enforce_csrf_checks=True)
    response = client.post("/login/", {"username": "bob", "password": PASSWORD})
    assert response.status_code == 403


def test_the_refusal_says_it_is_for_this_username_when_that_limit_tripped(bob):  # noqa: ANN001
    fail("bob", 3)
    response = attempt("bob", PASSWORD)
    assert response.status_code == 429
    assert b"for this username from your address" in response.content
    assert b"for any username" not in response.content


def test_the_refusal_says_it_is_for_the_address_when_that_limit_tripped(bob):  # noqa: ANN001
    for index in range(10):
        fail(f"guess{index}", 1)
    response = attempt("bob", PASSWORD)
    assert response.status_code == 429
    assert b"from your address, for any username" in response.content
    assert b"for this username" not in response.content
    assert b"Try again in 10 minutes" in response.content


# --- names that read the same ---------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["𝐛𝐨𝐛", "ｂｏｂ", "BOB", "Bob ", "ᵇᵒᵇ"])
def test_a_look_alike_spelling_counts_against_the_same_throttle(bob, spelling):  # noqa: ANN001
    """Django's sign-in form reads 𝐛𝐨𝐛 as bob (NFKC): locked out as bob, it stays locked."""
    fail("bob", 3)
    response = attempt(spelling, PASSWORD)
    assert response.status_code == 429, spelling
    assert "_auth_user_id" not in Client().session


def test_failures_in_look_alike_spellings_add_up(bob):  # noqa: ANN001
    for spelling in ("𝐛𝐨𝐛", "ｂｏｂ", "BOB"):
        assert attempt(spelling, "wrong").status_code == 200
    assert attempt("bob", PASSWORD).status_code == 429


def test_a_signed_in_session_trying_another_name_is_counted_not_cleared(bob, carol):  # noqa: ANN001
    """carol, signed in (not staff), tries bob's password on the admin sign-in."""
    client = Client(REMOTE_ADDR="198.51.100.1")
    client.force_login(carol)
    for _ in range(3):
        assert client.post("/admin/login/", {"username": "bob", "password": "x"}).status_code == 200
    assert attempt("bob", PASSWORD).status_code == 429


def test_the_admin_sign_in_is_throttled_too(db):  # noqa: ANN001
    from django.contrib.auth import get_user_model

    staff = get_user_model().objects.create_user("ops", password=PASSWORD, is_staff=True)
    client = Client(REMOTE_ADDR="198.51.100.9")
    for _ in range(3):
        answer = client.post("/admin/login/", {"username": "ops", "password": "wrong"})
        assert answer.status_code == 200
    refused = client.post("/admin/login/", {"username": "ＯＰＳ", "password": PASSWORD})
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 500
    assert "_auth_user_id" not in client.session
    # Another address still signs in, and that clears nothing of the first one's count.
    other = Client(REMOTE_ADDR="198.51.100.10")
    assert other.post("/admin/login/", {"username": "ops", "password": PASSWORD}).status_code == 302
    assert int(other.session["_auth_user_id"]) == staff.pk
