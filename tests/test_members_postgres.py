"""Two admins demoting each other at once on PostgreSQL: exactly one change wins, and the
tenant keeps an admin. The first change is held uncommitted until the second is seen
waiting for the tenant's lock, so the race takes the same path every time."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from cairn.errors import LastAdmin
from tenants import roles
from tenants.services import Actor, member_set_role, permissions_of
from tests.factories import UserFactory

pytestmark = pytest.mark.postgres


def _blocked_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] >= 1


def test_two_admins_demoting_each_other_leave_one_admin(postgres_only, acme, alice):  # noqa: ANN001
    erin = UserFactory(username="erin")
    member_set_role(tenant=acme, user=erin, role="admin", actor=Actor.system("test"))
    outcome: dict = {}
    holding, release = threading.Event(), threading.Event()

    def first() -> None:
        try:
            with transaction.atomic():
                member_set_role(tenant=acme, user=erin, role="operator", actor=Actor(user=alice))
                holding.set()
                assert release.wait(30), "the second change never waited"
            outcome["first"] = "done"
        finally:
            connections.close_all()

    def second() -> None:
        try:
            member_set_role(tenant=acme, user=alice, role="operator", actor=Actor(user=erin))
            outcome["second"] = "done"
        except LastAdmin as exc:
            outcome["second"] = exc
        finally:
            connections.close_all()

    one = threading.Thread(target=first)
    one.start()
    assert holding.wait(30)
    two = threading.Thread(target=second)
    two.start()
    for _ in range(300):
        if _blocked_on_a_lock():
            break
        threading.Event().wait(0.05)
    else:
        pytest.fail("the second change did not wait for the tenant's lock")
    release.set()
    one.join(30)
    two.join(30)
    assert outcome["first"] == "done"
    assert isinstance(outcome["second"], LastAdmin)
    assert roles.ADMIN in permissions_of(user=alice, tenant=acme)
    assert roles.ADMIN not in permissions_of(user=erin, tenant=acme)
