"""Forms of the console's read pages (GET filters). The action forms live with the actions."""

from __future__ import annotations

from django import forms
from django.db.models import Q

from checkpoints.models import RunStatus, WorkflowDefinition
from console.selectors import DEFAULT_SORT, SORTS
from tenants.models import Tenant

SORT_CHOICES = [
    ("-created", "Newest first"),
    ("created", "Oldest first"),
    ("-updated", "Recently updated"),
    ("updated", "Least recently updated"),
    ("-restores", "Most restores"),
    ("restores", "Fewest restores"),
]
assert {key.lstrip("-") for key, _ in SORT_CHOICES} == set(SORTS)


class DateInput(forms.DateInput):
    input_type = "date"


class RunFilterForm(forms.Form):
    """The runs page's filters. They travel in the query string, so a view is a bookmark."""

    q = forms.CharField(
        label="Search run id or objective",
        required=False,
        max_length=200,
        widget=forms.TextInput(attrs={"type": "search", "placeholder": "id prefix or text"}),
    )
    status = forms.ChoiceField(required=False, choices=[("", "Any status"), *RunStatus.choices])
    workflow_type = forms.ChoiceField(label="Workflow", required=False, choices=[])
    workflow_version = forms.CharField(label="Version", required=False, max_length=50)
    state = forms.CharField(required=False, max_length=100)
    created_from = forms.DateField(label="Created from", required=False, widget=DateInput)
    created_to = forms.DateField(label="Created to", required=False, widget=DateInput)
    updated_from = forms.DateField(label="Updated from", required=False, widget=DateInput)
    updated_to = forms.DateField(label="Updated to", required=False, widget=DateInput)
    restored_more_than = forms.IntegerField(
        label="Restored more than", required=False, min_value=0, max_value=1_000_000
    )
    stalled = forms.BooleanField(label="Has stalled operations", required=False)
    waiting_approval = forms.BooleanField(label="Waiting for approval", required=False)
    paused = forms.BooleanField(label="Paused by an operator", required=False)
    sort = forms.ChoiceField(required=False, choices=SORT_CHOICES)

    def __init__(self, *args: object, tenant: Tenant, **kwargs: object) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        types = (
            WorkflowDefinition.objects.filter(Q(tenant=tenant) | Q(tenant__isnull=True))
            .order_by("workflow_type")
            .values_list("workflow_type", flat=True)
            .distinct()
        )
        self.fields["workflow_type"].choices = [("", "Any workflow")] + [(t, t) for t in types]

    def clean_sort(self) -> str:
        return self.cleaned_data.get("sort") or DEFAULT_SORT

    def clean(self) -> dict:
        data = super().clean()
        for field in ("created", "updated"):
            start, end = data.get(f"{field}_from"), data.get(f"{field}_to")
            if start and end and start > end:
                self.add_error(f"{field}_to", "The end of the range is before its start.")
        return data

    def active_count(self) -> int:
        """How many filters the query string sets (the sort is not a filter)."""
        if not self.is_bound:
            return 0
        return sum(1 for name in self.fields if name != "sort" and self.data.get(name))

    def left_out(self) -> str:
        """The filters the server could not read, as one sentence: "Label (why); …"."""
        parts = [
            f"{field.label} ({' '.join(str(e).rstrip('.') for e in field.errors)})"
            for field in self
            if field.errors
        ]
        sentence = "; ".join(parts) + "." if parts else ""
        extra = " ".join(str(e) for e in self.non_field_errors())
        return f"{sentence} {extra}".strip()

    def filters(self) -> dict:
        """The valid filters; an invalid one is left out (and shown with its error)."""
        if not self.is_bound:
            return {"sort": DEFAULT_SORT}
        self.is_valid()
        data = dict(self.cleaned_data)
        data.setdefault("sort", DEFAULT_SORT)
        return data
