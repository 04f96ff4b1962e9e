"""LangGraph threads in the console: a run like any other, waiting while interrupted, its
update_state branches shown as forks, its envelopes readable."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from langgraph.types import Command

from langgraph_store.saver import CairnSaver
from langgraph_store.selectors import thread_runs
from tests.langgraph_support import config, interrupt_graph

pytestmark = pytest.mark.django_db(transaction=True)


def page(user, name: str, *args) -> str:  # noqa: ANN001, ANN002
    client = Client()
    client.force_login(user)
    response = client.get(reverse(name, args=args))
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def test_a_thread_is_a_run_that_waits_forks_and_shows_its_envelopes(acme, bob):
    graph = interrupt_graph(CairnSaver(tenant="acme"))
    graph.invoke({"log": []}, config("t1"))
    [run] = thread_runs(tenant=acme, thread_id="t1")

    html = page(bob, "console:run_detail", run.pk)
    assert 'data-field="state">interrupted<' in html
    assert "Waiting Approval" in html and "interrupt()" in html

    graph.invoke(Command(resume="yes"), config("t1"))
    after_a = next(s for s in graph.get_state_history(config("t1")) if s.next == ("ask",))
    graph.update_state(after_a.config, {"log": ["edited"]})
    main, fork = thread_runs(tenant=acme, thread_id="t1")
    assert reverse("console:run_detail", args=[fork.pk]) in page(bob, "console:run_detail", main.pk)
    assert "Forked from run" in page(bob, "console:run_detail", fork.pk)

    envelope = page(bob, "console:checkpoint_detail", main.pk, 2)
    assert "langgraph" in envelope and "checkpoint_sha256" in envelope
    runs = page(bob, "console:runs")
    assert str(main.pk)[:8] in runs and str(fork.pk)[:8] in runs
