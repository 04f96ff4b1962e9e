"""Factories for test data. Rows that have invariants are made through the services."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from tenants.models import Tenant


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = factory.django.Password("correct horse battery staple")


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"tenant{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())


SIMPLE_DEFINITION = {
    "initial": "collect_sources",
    "states": ["collect_sources", "draft_answer", "review", "publish", "done", "rejected"],
    "transitions": [
        ["collect_sources", "draft_answer"],
        ["draft_answer", "review"],
        ["review", "publish"],
        ["review", "rejected"],
        ["publish", "done"],
    ],
    "terminal": ["done", "rejected"],
    "approval_states": ["review"],
    "effect_states": ["publish"],
}
