"""The console in a real browser: sign in, filter the runs, open a run."""

from __future__ import annotations


def test_an_operator_signs_in_and_sees_the_menu_of_the_role(live_server, page, login, bob):  # noqa: ANN001
    login(page, bob)
    nav = page.get_by_role("navigation", name="Main")
    assert nav.get_by_role("link", name="Runs").is_visible()
    assert nav.get_by_role("link", name="Health").count() == 0
