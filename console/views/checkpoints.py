"""One checkpoint: its envelope by field group, the diff to its parent, the chain check."""

from __future__ import annotations

from uuid import UUID

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from cairn.errors import CairnError
from checkpoints.models import Checkpoint
from checkpoints.selectors import checkpoint_read
from checkpoints.services.integrity import run_verify
from console import run_reads
from console.envelope_diff import envelope_groups
from tenants import roles
from tenants.access import console_view

GROUP_TITLES = {
    "identity": "Identity",
    "position": "Position",
    "inputs": "Inputs",
    "evidence": "Evidence",
    "side_effects": "Side effects",
    "budgets": "Budgets",
    "control": "Control",
    "compatibility": "Compatibility",
}


COMPARE_CHOICES_LIMIT = 200


def _against(request: HttpRequest, run, sequence: int) -> int | None:  # noqa: ANN001
    """The checkpoint chosen to compare with, or None for the parent."""
    raw = request.GET.get("against", "")
    if not raw.isdigit() or len(raw) > 18:
        return None
    chosen = int(raw)
    return None if chosen == sequence else chosen


@console_view(roles.OPERATE)
def checkpoint_detail(request: HttpRequest, run_id: UUID, sequence: int) -> HttpResponse:
    access = request.console
    run = run_reads.run_for_page(tenant=access.tenant, run_id=run_id)
    try:
        # Both decrypting reads are audited by checkpoint_read.
        checkpoint, envelope = checkpoint_read(
            tenant=access.tenant, run_id=run.pk, sequence=sequence, actor=access.actor
        )
    except CairnError as exc:
        if exc.status == 404:
            raise Http404(exc.detail)
        return render(
            request,
            "console/checkpoint_detail.html",
            {"run": run, "sequence": sequence, "error": exc.detail},
        )
    # The Parent field always names the checkpoint's own parent (a fork's first checkpoint
    # has the source run's checkpoint as its parent); the diff compares with that parent or
    # with the checkpoint chosen in "Compare with" (``?against=N``).
    parent, parent_missing = None, ""
    if checkpoint.parent_id:
        parent = (
            Checkpoint.objects.filter(tenant=access.tenant, pk=checkpoint.parent_id)
            .only("id", "run_id", "sequence", "sha256")
            .first()
        )
        if parent is None:
            parent_missing = "The parent checkpoint no longer exists (removed by retention)."
    compared, parent_envelope, parent_error = parent, None, parent_missing
    against = _against(request, run, sequence)
    if against is not None:
        compared = (
            Checkpoint.objects.filter(tenant=access.tenant, run=run, sequence=against)
            .only("id", "run_id", "sequence", "sha256")
            .first()
        )
        parent_error = (
            "" if compared else f"The run has no checkpoint #{against} (any more) to compare with."
        )
    if compared is not None:
        parent_envelope, parent_error = run_reads.envelope_for_page(
            access, run_id=compared.run_id, sequence=compared.sequence
        )
    groups = envelope_groups(envelope, parent_envelope)
    context = {
        "run": run,
        "checkpoint": checkpoint,
        "sequence": sequence,
        "groups": [(GROUP_TITLES.get(g.name, g.name), g) for g in groups],
        "parent": parent,
        "parent_missing": parent_missing,
        "compared": compared,
        "parent_error": parent_error,
        "has_parent_envelope": parent_envelope is not None,
        "against": against,
        "compare_choices": list(
            Checkpoint.objects.filter(run=run)
            .exclude(sequence=sequence)
            .order_by("-sequence")
            .values_list("sequence", "state")[:COMPARE_CHOICES_LIMIT]
        ),
        "verification": run_verify(tenant=access.tenant, run_id=run.pk),
    }
    return render(request, "console/checkpoint_detail.html", context)
