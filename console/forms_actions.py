"""Forms of the operator actions. Each carries the run version the page showed (hidden) and
asks for a reason; the services check everything again, these only shape the input."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import forms

from checkpoints.models import Checkpoint, Run
from checkpoints.services.budgets import BUDGET_LIMIT_MAX
from console.form_fields import json_object_from_text
from runtime.services.actions import MAX_REASON
from runtime.services.forks import forkable_sequences
from runtime.services.retry import retry_choices

# The fork form offers this many of the newest checkpoints (the API accepts any).
FORK_CHOICES_LIMIT = 100


class DateTimeLocalInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs=attrs, format="%Y-%m-%dT%H:%M")


class ActionForm(forms.Form):
    version = forms.IntegerField(widget=forms.HiddenInput, min_value=1)
    reason = forms.CharField(
        max_length=MAX_REASON,
        widget=forms.Textarea(attrs={"rows": 3, "autofocus": True}),
        help_text="Recorded with the action in the run's audit trail.",
    )

    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        self.run = run
        super().__init__(*args, **kwargs)


class ResumeForm(ActionForm):
    pass


class CancelForm(ActionForm):
    pass


class PauseForm(ActionForm):
    pass


class UnpauseForm(ActionForm):
    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        super().__init__(*args, run=run, **kwargs)
        self.fields["reason"].required = False


class RetryForm(ActionForm):
    step = forms.ChoiceField(label="Step to run again")

    field_order = ["step", "reason", "version"]

    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        super().__init__(*args, run=run, **kwargs)
        self.fields["step"].choices = [
            (c.step, f"{c.step} (state {c.state})" if c.step != c.state else c.step)
            for c in retry_choices(run)
        ]


class ForkForm(ActionForm):
    from_sequence = forms.TypedChoiceField(label="From checkpoint", coerce=int)
    inputs_patch = forms.CharField(
        label="Change the inputs (optional)",
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "class": "mono", "spellcheck": "false"}),
        help_text='A JSON merge patch of the run\'s inputs, e.g. {"lang": "de", "draft": null}: '
        "null removes an input, objects merge.",
    )

    field_order = ["from_sequence", "inputs_patch", "reason", "version"]

    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        super().__init__(*args, run=run, **kwargs)
        rows = list(
            Checkpoint.objects.filter(run=run)
            .order_by("-sequence")
            .values_list("sequence", "state", "step", "created_at")[:FORK_CHOICES_LIMIT]
        )
        # Only checkpoints the fork service accepts: a terminal one, or one past an approval
        # state, is always refused; the newest one it accepts is the default.
        allowed = set(forkable_sequences(run, [(r[0], r[1]) for r in rows]))
        rows = [r for r in rows if r[0] in allowed]
        if rows and not self.is_bound and "from_sequence" not in (self.initial or {}):
            self.initial["from_sequence"] = rows[0][0]
        self.fields["from_sequence"].choices = [
            (
                seq,
                f"#{seq} · {state}{f' / {step}' if step and step != state else ''} · "
                f"{created:%Y-%m-%d %H:%M:%S}",
            )
            for seq, state, step, created in rows
        ]

    def clean_inputs_patch(self) -> dict[str, Any] | None:
        text = self.cleaned_data["inputs_patch"].strip()
        if not text:
            return None
        return json_object_from_text(text, name="patch")


class GrantBudgetForm(ActionForm):
    attempts = forms.IntegerField(
        label="More attempts", required=False, min_value=1, max_value=BUDGET_LIMIT_MAX
    )
    tokens = forms.IntegerField(
        label="More tokens", required=False, min_value=1, max_value=BUDGET_LIMIT_MAX
    )
    cost = forms.DecimalField(
        label="More cost",
        required=False,
        min_value=0,
        max_value=BUDGET_LIMIT_MAX,
        decimal_places=6,
        max_digits=22,
    )
    deadline = forms.DateTimeField(
        label="New deadline (UTC)",
        required=False,
        widget=DateTimeLocalInput,
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"],
    )

    field_order = ["attempts", "tokens", "cost", "deadline", "reason", "version"]

    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        super().__init__(*args, run=run, **kwargs)
        # Offer only what has a limit to raise (the service refuses the others).
        limits = run.budget_limits or {}
        for name, key in (
            ("attempts", "max_attempts"),
            ("tokens", "max_tokens"),
            ("cost", "max_cost"),
            ("deadline", "deadline"),
        ):
            if limits.get(key) is None:
                del self.fields[name]

    def clean_cost(self) -> float | None:
        cost = self.cleaned_data["cost"]
        if cost is not None and cost <= 0:
            raise forms.ValidationError("Grant more than 0.")
        return float(cost) if cost is not None else None

    def clean_deadline(self) -> datetime | None:
        value = self.cleaned_data["deadline"]
        # The console works in UTC (TIME_ZONE); make that explicit for the service.
        return value.astimezone(UTC) if value is not None else None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not any(data.get(k) is not None for k in ("attempts", "tokens", "cost", "deadline")):
            raise forms.ValidationError("Name what to grant: attempts, tokens, cost or a deadline.")
        return data


class RecordOutcomeForm(ActionForm):
    outcome = forms.ChoiceField(
        label="What happened at the provider",
        choices=[
            ("confirmed", "It happened (confirmed)"),
            ("failed", "It did not happen (failed)"),
        ],
        widget=forms.RadioSelect,
    )
    provider_operation_id = forms.CharField(
        label="Provider's operation id",
        required=False,
        max_length=200,
        help_text="Required when it happened: the id the provider shows for it.",
    )

    field_order = ["outcome", "provider_operation_id", "reason", "version"]

    def __init__(self, *args: Any, run: Run, **kwargs: Any) -> None:
        super().__init__(*args, run=run, **kwargs)
        self.fields["reason"].label = "How do you know?"
        self.fields["reason"].help_text = "Recorded with the outcome in the audit trail."

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("outcome") == "confirmed" and not data.get("provider_operation_id"):
            self.add_error(
                "provider_operation_id", "Give the provider's id of the operation that happened."
            )
        return data
