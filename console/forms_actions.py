"""Forms of the operator actions. Each carries the run version the page showed (hidden) and
asks for a reason; the services check everything again, these only shape the input."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.urls import reverse

from checkpoints.models import Checkpoint, Run
from checkpoints.services.budgets import BUDGET_LIMIT_MAX
from console.form_fields import json_object_from_text
from runtime.services.actions import MAX_REASON
from runtime.services.bulk import LABELS as BULK_LABELS
from runtime.services.forks import fork_input_values, forkable_sequences, inputs_patch_between
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
    """The fork editor: the operator edits the chosen checkpoint's input values (what the
    steps read as ``ctx.inputs``); the form hands the service the merge patch between them
    (``inputs_patch``), so the service's rules (and refusals) are the API's."""

    from_sequence = forms.TypedChoiceField(label="From checkpoint", coerce=int)
    inputs = forms.CharField(
        label="Inputs at the checkpoint",
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "class": "mono", "spellcheck": "false"}),
        help_text="The input values the workflow's steps read, as recorded in the chosen "
        "checkpoint. Edit them as JSON: change a value, add one, or delete a line to remove "
        "an input. The next page shows each change before → after.",
    )

    field_order = ["from_sequence", "inputs", "reason", "version"]

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
        if rows and not self.is_bound and not self.initial.get("from_sequence"):
            self.initial["from_sequence"] = rows[0][0]
        self.fields["from_sequence"].choices = [
            (
                seq,
                f"#{seq} · {state}{f' / {step}' if step and step != state else ''} · "
                f"{created:%Y-%m-%d %H:%M:%S}",
            )
            for seq, state, step, created in rows
        ]
        # Choosing another checkpoint reloads the form with that checkpoint's values.
        self.fields["from_sequence"].widget.attrs.update(
            {
                "hx-get": reverse("console:run_action", args=[run.pk, "fork"]),
                "hx-target": "closest .action-body",
                "hx-swap": "outerHTML",
                "hx-include": "previous [name=version]",
                "hx-disabled-elt": "this",
            }
        )
        if not self.is_bound and "inputs" not in self.initial:
            sequence = str(self.initial.get("from_sequence") or "")
            if sequence.isdigit() and int(sequence) in allowed:
                values = fork_input_values(
                    tenant=run.tenant, run_id=run.pk, from_sequence=int(sequence)
                )
                self.initial["inputs"] = json.dumps(values, indent=2, sort_keys=True)

    def clean_inputs(self) -> dict[str, Any] | None:
        text = self.cleaned_data["inputs"].strip()
        return json_object_from_text(text, name="inputs") if text else None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        sequence, edited = data.get("from_sequence"), data.get("inputs")
        data["inputs_patch"] = None
        if sequence is None or edited is None:
            return data
        before = fork_input_values(
            tenant=self.run.tenant, run_id=self.run.pk, from_sequence=sequence
        )
        if any(v is None and before.get(k, 0) is not None for k, v in edited.items()):
            # In a merge patch null removes: a value cannot become null.
            self.add_error("inputs", "An input cannot be null here; delete its line to remove it.")
            return data
        data["inputs_patch"] = inputs_patch_between(before, edited) or None
        return data


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


class BulkActionForm(forms.Form):
    """A bulk action on the selected runs: which action, a retry's step, and the reason (each
    run's own audit event carries it). The service checks everything again."""

    action = forms.ChoiceField(label="Action", choices=list(BULK_LABELS.items()))
    step = forms.CharField(
        label="Step to run again (retry only)",
        required=False,
        max_length=100,
        help_text="The step's name or its state; a run that has not reached it is refused.",
    )
    reason = forms.CharField(
        max_length=MAX_REASON,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Recorded with the bulk action and with each run's own action in its audit "
        "trail.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)

    def clean(self) -> dict:
        data = super().clean()
        if data.get("action") == "retry" and not (data.get("step") or "").strip():
            self.add_error("step", "Name the step a retry runs again.")
        return data
