"""Four eyes: whoever started the run, raised the request, or uploaded or committed the
artifact under review cannot decide it.

The rule is written once, as one condition per way of being involved. The decision
(``approval_decide``, from the API and the review page alike) asks ``four_eyes_refusal`` and
refuses with ``self_approval_forbidden``; the reviewer's queue leaves out the requests a
person could only be refused on (``four_eyes_involved``), and the review page says why.
"""

from __future__ import annotations

from functools import reduce
from operator import or_

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Exists, OuterRef, Q

from approvals.models import ApprovalRequest
from checkpoints.models import ArtifactReference, ArtifactUpload, Checkpoint

# Each way of being involved, as the refusal says it: "You …, so someone else decides it."
INVOLVEMENT = {
    "requested": "asked for this approval",
    "started": "started this run",
    "uploaded": "uploaded the artifact under review",
    "committed": "committed the artifact under review (a checkpoint of this run names it)",
}


def _conditions(user: AbstractBaseUser) -> dict[str, Exists]:
    """One condition on an ApprovalRequest row per way ``user`` is involved in it. A
    checkpoint records its writer by name (``Actor.name``: a person's username)."""
    name = user.get_username()
    return {
        "requested": Exists(
            ApprovalRequest.objects.filter(pk=OuterRef("pk"), requester_id=user.pk)
        ),
        "started": Exists(
            Checkpoint.objects.filter(run_id=OuterRef("run_id"), sequence=1, actor=name)
        ),
        "uploaded": Exists(
            ArtifactUpload.objects.filter(artifact_id=OuterRef("artifact_id"), uploaded_by=user)
        ),
        "committed": Exists(
            ArtifactReference.objects.filter(
                artifact_id=OuterRef("artifact_id"),
                checkpoint__run_id=OuterRef("run_id"),
                checkpoint__actor=name,
            )
        ),
    }


def four_eyes_involved(user: AbstractBaseUser) -> Q:
    """Requests ``user`` is involved in, so may not decide (a queryset filter)."""
    return reduce(or_, (Q(condition) for condition in _conditions(user).values()))


def four_eyes_refusal(*, request: ApprovalRequest, user: AbstractBaseUser) -> str:
    """The sentence refusing ``user`` a decision on ``request``, or "" when they may
    decide. One query."""
    conditions = _conditions(user)
    row = (
        ApprovalRequest.objects.filter(pk=request.pk)
        .annotate(**{f"is_{key}": condition for key, condition in conditions.items()})
        .values(*(f"is_{key}" for key in conditions))
        .first()
    ) or {}
    involved = [key for key in INVOLVEMENT if row.get(f"is_{key}")]
    if not involved:
        return ""
    return f"You {INVOLVEMENT[involved[0]]}, so someone else has to decide it"
