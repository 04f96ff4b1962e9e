"""Field cleaning shared by the console's forms."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from checkpoints.envelope import json_problem


def json_object_from_text(text: str, *, name: str) -> dict[str, Any]:
    """Parse ``text`` as a JSON object a checkpoint can store, or raise ValidationError.

    ``name`` is what the field holds ("inputs", "patch"): the errors speak of it, so the
    person reads which field to fix and why."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(f"This is not JSON: {exc.msg} (line {exc.lineno}).")
    except RecursionError:
        raise forms.ValidationError("This cannot be stored: it is nested too deeply.")
    if not isinstance(value, dict):
        raise forms.ValidationError(f'The {name} must be a JSON object, like {{"lang": "de"}}.')
    problem = json_problem(value, where=f"the {name}")
    if problem:
        raise forms.ValidationError(f"This cannot be stored: {problem}.")
    return value
