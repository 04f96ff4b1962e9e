"""Four eyes: whoever started the run, raised the request, or uploaded or committed the
artifact under review cannot decide it. A fork continues its source's work, so "the run" is
the run and every run it was forked from (its lineage).

The rule is written once, as one condition per way of being involved. The decision
(``approval_decide``, from the API and the review page alike) asks ``four_eyes_refusal`` and
refuses with ``self_approval_forbidden``; the reviewer's queue leaves out the requests a
person could only be refused on (``four_eyes_involved``), and the review page says why.
"""

from __future__ import annotations

from functools import reduce
from operator import or_

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.db.models import BooleanField, Exists, Expression, OuterRef, Q
from django.db.models.expressions import RawSQL

from approvals.models import ApprovalRequest
from checkpoints.models import ArtifactReference, ArtifactUpload, Checkpoint, Run

# Each way of being involved, as the refusal says it: "You …, so someone else decides it."
INVOLVEMENT = {
    "requested": "asked for this approval",
    "started": "started this run (or the run it was forked from)",
    "uploaded": "uploaded the artifact under review",
    "committed": "committed the artifact under review (a checkpoint of this run names it)",
}


def _in_lineage(condition: str, params: list[object]) -> RawSQL:
    """EXISTS a checkpoint, in the request's run or a run it was forked from (however far
    back), that meets ``condition`` (SQL on the checkpoint ``c``). One recursive query,
    correlated with the ApprovalRequest row, on PostgreSQL and SQLite alike."""
    q = connection.ops.quote_name
    run, checkpoint = q(Run._meta.db_table), q(Checkpoint._meta.db_table)
    request = q(ApprovalRequest._meta.db_table)
    sql = (
        f"EXISTS (WITH RECURSIVE lineage(id) AS ("
        f"SELECT {request}.{q('run_id')} UNION "
        f"SELECT r.{q('forked_from_run_id')} FROM {run} r JOIN lineage ON r.{q('id')} = lineage.id "
        f"WHERE r.{q('forked_from_run_id')} IS NOT NULL) "
        f"SELECT 1 FROM {checkpoint} c WHERE c.{q('run_id')} IN (SELECT id FROM lineage) "
        f"AND {condition})"
    )
    return RawSQL(sql, params, output_field=BooleanField())


def _conditions(user: AbstractBaseUser) -> dict[str, Expression]:
    """One condition on an ApprovalRequest row per way ``user`` is involved in it. A
    checkpoint records its writer by name (``Actor.name``: a person's username)."""
    q = connection.ops.quote_name
    name = user.get_username()
    references = q(ArtifactReference._meta.db_table)
    request = q(ApprovalRequest._meta.db_table)
    return {
        "requested": Exists(
            ApprovalRequest.objects.filter(pk=OuterRef("pk"), requester_id=user.pk)
        ),
        "started": _in_lineage(f"c.{q('sequence')} = 1 AND c.{q('actor')} = %s", [name]),
        "uploaded": Exists(
            ArtifactUpload.objects.filter(artifact_id=OuterRef("artifact_id"), uploaded_by=user)
        ),
        # Named by a checkpoint written in their name (a fork's genesis copies its source's
        # evidence: whoever forked a run with the artifact committed it too).
        "committed": _in_lineage(
            f"c.{q('actor')} = %s AND EXISTS (SELECT 1 FROM {references} a WHERE "
            f"a.{q('checkpoint_id')} = c.{q('id')} AND "
            f"a.{q('artifact_id')} = {request}.{q('artifact_id')})",
            [name],
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
