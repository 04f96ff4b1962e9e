"""Starting a run from the console: the workflow, its inputs, an objective and a budget.

Thin: the form shapes the input, ``run_create`` checks everything and writes the run."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from cairn.errors import CairnError
from checkpoints.services.budgets import BUDGET_LIMIT_MAX
from checkpoints.services.workflows import workflows_visible
from console.form_fields import json_object_from_text
from runtime.services.runs import budget_with_defaults, run_create
from tenants import roles
from tenants.access import console_view
from tenants.models import Tenant


class RunStartForm(forms.Form):
    workflow = forms.ChoiceField(label="Workflow")
    inputs = forms.CharField(
        label="Inputs (JSON object)",
        required=False,
        initial="{}",
        widget=forms.Textarea(attrs={"rows": 5, "class": "mono", "spellcheck": "false"}),
        help_text='e.g. {"question": "Why do hikers build cairns?"}',
    )
    objective_ref = forms.CharField(label="Objective (optional)", required=False, max_length=500)
    max_attempts = forms.IntegerField(
        label="Attempts limit", min_value=1, max_value=BUDGET_LIMIT_MAX, required=False
    )
    max_tokens = forms.IntegerField(
        label="Tokens limit (optional)", min_value=1, max_value=BUDGET_LIMIT_MAX, required=False
    )
    max_cost = forms.FloatField(
        label="Cost limit (optional)", min_value=0, max_value=BUDGET_LIMIT_MAX, required=False
    )

    def __init__(self, *args: Any, tenant: Tenant, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        rows = workflows_visible(tenant=tenant).order_by("workflow_type", "-created_at")
        seen: dict[str, str] = {}
        for row in rows.values_list("workflow_type", "version"):
            seen.setdefault(f"{row[0]}@{row[1]}", f"{row[0]} version {row[1]}")
        self.fields["workflow"].choices = list(seen.items())
        self.fields["max_attempts"].initial = settings.CAIRN_DEFAULT_MAX_ATTEMPTS
        self.fields[
            "max_attempts"
        ].help_text = f"Empty: {settings.CAIRN_DEFAULT_MAX_ATTEMPTS} (CAIRN_DEFAULT_MAX_ATTEMPTS)."

    def clean_inputs(self) -> dict[str, Any]:
        text = (self.cleaned_data["inputs"] or "").strip() or "{}"
        return json_object_from_text(text, name="inputs")


@console_view(roles.OPERATE)
def run_start(request: HttpRequest) -> HttpResponse:
    access = request.console
    form = RunStartForm(request.POST or None, tenant=access.tenant)
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            data = form.cleaned_data
            workflow_type, _, version = data["workflow"].rpartition("@")
            budget = {
                k: data[k]
                for k in ("max_attempts", "max_tokens", "max_cost")
                if data[k] is not None
            }
            try:
                run = run_create(
                    tenant=access.tenant,
                    workflow_type=workflow_type,
                    workflow_version=version,
                    inputs=data["inputs"],
                    objective_ref=data["objective_ref"],
                    budget=budget_with_defaults(budget),
                    actor=access.actor,
                )
            except CairnError as exc:
                form.add_error(None, exc.detail)
                status = exc.status
            else:
                messages.success(request, f"Run {str(run.pk)[:8]} started.")
                return redirect("console:run_detail", run_id=run.pk)
    return render(request, "console/run_start.html", {"form": form}, status=status)
