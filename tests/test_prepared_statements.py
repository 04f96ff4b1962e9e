"""The hot statements (the token's, the commit's) run on a server-side prepared statement
through one kept cursor per connection (``tenants.prepared``): whatever happened to the
statement before it, a failed statement, a rolled-back transaction or a closed connection,
the next one runs and answers."""

from __future__ import annotations

import threading

import pytest
from django.db import DataError, connection, transaction

from tenants.prepared import prepared_fetchone

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

DIVIDE = "SELECT 10 / %(by)s::integer"


def test_the_statement_answers_again_after_one_failed_in_a_transaction():
    assert prepared_fetchone(DIVIDE, {"by": 5}) == (2,)
    with pytest.raises(DataError), transaction.atomic():
        prepared_fetchone(DIVIDE, {"by": 0})
    assert prepared_fetchone(DIVIDE, {"by": 2}) == (5,)


def test_it_answers_on_a_new_connection_after_the_old_one_closed():
    assert prepared_fetchone(DIVIDE, {"by": 1}) == (10,)
    first = connection.connection
    connection.close()
    assert prepared_fetchone(DIVIDE, {"by": 10}) == (1,)
    assert connection.connection is not first


def test_threads_each_answer_on_their_own_connection():
    answers: dict[int, tuple | None] = {}

    def ask(by: int) -> None:
        try:
            for _ in range(20):
                answers[by] = prepared_fetchone(DIVIDE, {"by": by})
        finally:
            connection.close()

    threads = [threading.Thread(target=ask, args=(by,)) for by in (1, 2, 5, 10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert answers == {1: (10,), 2: (5,), 5: (2,), 10: (1,)}
