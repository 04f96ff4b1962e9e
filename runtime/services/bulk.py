"""Bulk actions: cancel, resume, retry a named step, pause or unpause many runs at once.

A bulk action never decides a rule of its own. Its dry run (``bulk_action_plan``) asks each
selected run the refusal function of the action's service (``cancel_refusal``,
``resume_check``, ``retry_check``, ``pause_refusal``, ``unpause_refusal``), and its work
calls that service once per run, with the run's version as read, so each run is acted on,
refused and audited exactly as a single action would be.

``bulk_action_start`` records the action (who, what, why, the selection and its run ids)
with the bulk action's own audit event and queues its ``bulk.process`` command through the
outbox, one transaction. ``bulk_action_process`` (the Celery task ``runtime.
bulk_action_process``) claims the action and works through the runs in chunks: each run's
service call and the record of its outcome (``BulkActionRun``) commit together, so a worker
killed mid-way leaves every run either acted on and recorded or untouched, and the next
worker (after the claim expires, queued again by ``bulk_actions_rescue``) goes on with the
runs still pending and never acts twice on one.

The selection is capped at ``CAIRN_BULK_ACTION_MAX_RUNS`` runs (docs/deployment.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Coalesce

from cairn import clock
from cairn.credentials import free_text_refuse
from cairn.errors import CairnError, InvalidRequest, NotFound
from cairn.faults import fault_point
from checkpoints.models import (
    BulkAction,
    BulkActionRun,
    BulkActionRunOutcome,
    BulkActionStatus,
    OutboxMessage,
    Run,
    RunStatus,
)
from checkpoints.services import outbox
from runtime.services.actions import (
    locked_run,
    no_such_run,
    reason_clean,
    resume_check,
    run_resume,
)
from runtime.services.cancel import cancel_refusal, run_cancel, run_cancel_settle
from runtime.services.pause import pause_refusal, run_pause, run_unpause, unpause_refusal
from runtime.services.retry import retry_check, run_retry
from tenants.models import Tenant
from tenants.services import Actor, audit_record

# How many runs one chunk takes; the claim is renewed after each.
CHUNK_SIZE = 50
KIND = "bulk.process"


# --- the rules: each one is the action's own ------------------------------------------------
def _raised(refusal: CairnError | None) -> None:
    if refusal is not None:
        raise refusal


def _words(refusal: str) -> None:
    if refusal:
        raise InvalidRequest(refusal)


# Each raises the refusal the action's service would raise for the run as it is.
RULES: dict[str, Callable[[Run, str], Any]] = {
    "cancel": lambda run, step: _raised(cancel_refusal(run)),
    "resume": lambda run, step: resume_check(run),
    "retry": lambda run, step: retry_check(run, step),
    "pause": lambda run, step: _words(pause_refusal(run)),
    "unpause": lambda run, step: _words(unpause_refusal(run)),
}
ACTIONS = tuple(RULES)
LABELS = {
    "cancel": "Cancel",
    "resume": "Resume",
    "retry": "Retry a step",
    "pause": "Pause",
    "unpause": "Unpause",
}


def _perform(bulk: BulkAction, run: Run, actor: Actor) -> Run:
    """The action's service on one run, at the version read under its lock."""
    common = {
        "tenant": bulk.tenant,
        "run_id": run.pk,
        "reason": bulk.reason,
        "expected_version": run.version,
        "actor": actor,
    }
    if bulk.action == "cancel":
        # Providers are asked after the run's outcome is recorded, outside its transaction.
        return run_cancel(**common, settle=False)
    if bulk.action == "resume":
        return run_resume(**common)
    if bulk.action == "retry":
        return run_retry(**common, step=bulk.step)
    if bulk.action == "pause":
        return run_pause(**common)
    return run_unpause(**common)


# --- selecting ------------------------------------------------------------------------------
def bulk_max_runs() -> int:
    return settings.CAIRN_BULK_ACTION_MAX_RUNS


def _too_many(count: int) -> InvalidRequest:
    cap = bulk_max_runs()
    return InvalidRequest(
        f"The selection holds {count} runs; a bulk action takes at most {cap} "
        "(CAIRN_BULK_ACTION_MAX_RUNS). Narrow the filter or tick fewer runs.",
        fields={"run_ids": f"at most {cap} runs"},
    )


def bulk_selection(runs: QuerySet[Run]) -> list[UUID]:
    """The ids of the runs a filter selects (the caller builds ``runs`` with the filter its
    list uses), newest first. Raises InvalidRequest past ``CAIRN_BULK_ACTION_MAX_RUNS``."""
    cap = bulk_max_runs()
    ids = list(runs.order_by("-created_at", "-pk").values_list("pk", flat=True)[: cap + 1])
    if len(ids) > cap:
        raise _too_many(runs.count())
    return ids


def _ids_clean(run_ids: Iterable[UUID | str]) -> list[UUID]:
    ids: list[UUID] = []
    seen: set[UUID] = set()
    for raw in run_ids:
        try:
            value = raw if isinstance(raw, UUID) else uuid.UUID(str(raw))
        except ValueError:
            raise InvalidRequest(
                f"{str(raw)[:60]!r} is not a run id.", fields={"run_ids": "run ids (UUIDs)"}
            )
        if value not in seen:
            seen.add(value)
            ids.append(value)
    if not ids:
        raise InvalidRequest(
            "No runs are selected: tick runs or choose a filter that matches some.",
            fields={"run_ids": "at least one run"},
        )
    if len(ids) > bulk_max_runs():
        raise _too_many(len(ids))
    return ids


def _action_clean(action: str, step: str) -> tuple[str, str]:
    if action not in RULES:
        raise InvalidRequest(
            f"Unknown bulk action {str(action)[:40]!r}; it is one of {', '.join(ACTIONS)}.",
            fields={"action": "one of " + ", ".join(ACTIONS)},
        )
    step = (step or "").strip()
    if action == "retry" and not step:
        raise InvalidRequest(
            "Name the step to run again: a retry needs a step.",
            fields={"step": "required for a retry"},
        )
    return action, step if action == "retry" else ""


# --- the dry run ----------------------------------------------------------------------------
@dataclass
class BulkPlan:
    action: str
    step: str
    total: int
    actionable: list[str] = field(default_factory=list)  # run ids, in selection order
    refusals: list[tuple[str, str]] = field(default_factory=list)  # (run id, sentence)

    def refusals_by_reason(self) -> list[tuple[str, int]]:
        """Each refusal's sentence with how many runs it refuses, most first."""
        counts: dict[str, int] = {}
        for _, reason in self.refusals:
            counts[reason] = counts.get(reason, 0) + 1
        return sorted(counts.items(), key=lambda item: -item[1])


def bulk_action_plan(
    *, tenant: Tenant, action: str, run_ids: Iterable[UUID | str], step: str = ""
) -> BulkPlan:
    """What the bulk action would do now, changing nothing: how many runs it would act on
    and, for each it would refuse, the refusal its service would raise. An id that names no
    run of the tenant (another tenant's too) is refused as "No such run."

    Raises InvalidRequest (an unknown action, a retry without a step, no runs, too many)."""
    action, step = _action_clean(action, step)
    ids = _ids_clean(run_ids)
    found = {
        run.pk: run
        for run in Run.objects.select_related("workflow").filter(tenant=tenant, pk__in=ids)
    }
    plan = BulkPlan(action=action, step=step, total=len(ids))
    for pk in ids:
        run = found.get(pk)
        try:
            if run is None:
                raise no_such_run()
            RULES[action](run, step)
        except CairnError as exc:
            plan.refusals.append((str(pk), exc.detail))
        else:
            plan.actionable.append(str(pk))
    return plan


# --- starting -------------------------------------------------------------------------------
def bulk_action_start(
    *,
    tenant: Tenant,
    actor: Actor,
    action: str,
    reason: str,
    run_ids: Iterable[UUID | str],
    selection: dict[str, Any],
    step: str = "",
) -> BulkAction:
    """Record the bulk action and queue its work (``bulk.process`` through the outbox),
    with its audit event ``runs.bulk_action``: one transaction. ``selection`` says how the
    runs were chosen (the list's filter as read, or ticks). Every selected id is kept, also
    one that names no run of the tenant: its outcome is "No such run."

    Raises InvalidRequest (no reason, an unknown action, a retry without a step, no runs,
    more than CAIRN_BULK_ACTION_MAX_RUNS) or SecretInEnvelope (a reason that looks like a
    credential); nothing is written then."""
    reason = reason_clean(reason)
    # Stored and audited in the clear: a search text that looks like a credential is refused.
    free_text_refuse({f"selection.{key}": str(value) for key, value in _flat(selection).items()})
    action, step = _action_clean(action, step)
    ids = _ids_clean(run_ids)
    with transaction.atomic():
        bulk = BulkAction.objects.create(
            tenant=tenant,
            actor=actor.user if actor.user is not None and actor.user.pk else None,
            actor_label=actor.name,
            action=action,
            step=step,
            reason=reason,
            selection=selection,
            total=len(ids),
        )
        BulkActionRun.objects.bulk_create(
            BulkActionRun(bulk_action=bulk, position=i, run_id=pk) for i, pk in enumerate(ids)
        )
        audit_record(
            tenant=tenant,
            actor=actor,
            action="runs.bulk_action",
            target=f"bulk action {bulk.pk}",
            reason=reason,
            details={
                "bulk_action_id": str(bulk.pk),
                "action": action,
                "step": step,
                "total": len(ids),
                "selection": selection,
            },
        )
        _queue(bulk)
    return bulk


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def _queue(bulk: BulkAction) -> None:
    outbox.outbox_enqueue(
        run=None, tenant_id=bulk.tenant_id, kind=KIND, payload={"bulk_action_id": str(bulk.pk)}
    )


# --- the work -------------------------------------------------------------------------------
def _claim(bulk_action_id: UUID | str) -> bool:
    now = clock.db_now()
    return bool(
        BulkAction.objects.filter(pk=bulk_action_id)
        .exclude(status=BulkActionStatus.FINISHED)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .update(
            claimed_until=now + timedelta(seconds=_claim_seconds()),
            status=BulkActionStatus.RUNNING,
            started_at=Coalesce(F("started_at"), now),
        )
    )


def _claim_seconds() -> int:
    # How long a worker's claim lasts without renewal (database clock); past it, the rescue
    # queues the action again for another worker.
    return settings.CAIRN_BULK_ACTION_CLAIM_SECONDS


def _actor(bulk: BulkAction) -> Actor:
    if bulk.actor is not None:
        return Actor(user=bulk.actor)
    return Actor.system(bulk.actor_label)


def _act_on(bulk: BulkAction, item: BulkActionRun, actor: Actor) -> Run | None:
    """Act on one selected run and record its outcome, one transaction; the run when it is
    left cancelling (its providers are asked after commit), else None."""
    with transaction.atomic():
        # Locked and read again: a worker that took the action over may have done it.
        if (
            not BulkActionRun.objects.select_for_update()
            .filter(pk=item.pk, outcome=BulkActionRunOutcome.PENDING)
            .exists()
        ):
            return None
        after = None
        try:
            run = locked_run(tenant=bulk.tenant, run_id=item.run_id)
            item.version_before = run.version
            with transaction.atomic():
                after = _perform(bulk, run, actor)
            item.outcome, item.detail = BulkActionRunOutcome.DONE, ""
            item.version_after = after.version
        except CairnError as exc:
            item.outcome, item.detail = BulkActionRunOutcome.REFUSED, exc.detail
        fault_point("bulk.run_acted")  # a worker may die here: nothing above is committed
        item.acted_at = clock.db_now()
        item.save(
            update_fields=["outcome", "detail", "version_before", "version_after", "acted_at"]
        )
        counter = "done" if item.outcome == BulkActionRunOutcome.DONE else "refused"
        BulkAction.objects.filter(pk=bulk.pk).update(**{counter: F(counter) + 1})
    if after is not None and after.status == RunStatus.CANCELLING:
        return after
    return None


def bulk_action_process(*, bulk_action_id: UUID | str, chunk_size: int = CHUNK_SIZE) -> BulkAction:
    """Work through the bulk action's pending runs, ``chunk_size`` at a time, each through
    its action's service; then mark it finished. Returns the action as it is after.

    Does nothing for a finished action or one another worker holds (its claim has not
    expired), so a command delivered twice is harmless. A run already recorded is never
    acted on again."""
    if not _claim(bulk_action_id):
        return BulkAction.objects.get(pk=bulk_action_id)
    bulk = BulkAction.objects.select_related("tenant", "actor").get(pk=bulk_action_id)
    actor = _actor(bulk)
    while True:
        chunk = list(
            BulkActionRun.objects.filter(
                bulk_action=bulk, outcome=BulkActionRunOutcome.PENDING
            ).order_by("position")[:chunk_size]
        )
        if not chunk:
            break
        for item in chunk:
            cancelling = _act_on(bulk, item, actor)
            if cancelling is not None:
                run_cancel_settle(tenant=bulk.tenant, run_id=cancelling.pk, actor=actor)
        BulkAction.objects.filter(pk=bulk.pk).update(
            claimed_until=clock.db_now() + timedelta(seconds=_claim_seconds())
        )
    BulkAction.objects.filter(pk=bulk.pk).update(
        status=BulkActionStatus.FINISHED, finished_at=clock.db_now(), claimed_until=None
    )
    return BulkAction.objects.get(pk=bulk.pk)


def bulk_actions_rescue() -> int:
    """Queue again each unfinished bulk action that no worker holds (its claim expired or it
    was never claimed) and whose last command went out more than
    CAIRN_BULK_ACTION_CLAIM_SECONDS ago: its worker died, or its command was lost. Returns
    how many were queued. Meant for a periodic task; the work it queues skips every run
    already recorded."""
    now = clock.db_now()
    quiet = now - timedelta(seconds=_claim_seconds())
    queued = 0
    waiting = BulkAction.objects.exclude(status=BulkActionStatus.FINISHED).filter(
        Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)
    )
    for bulk in waiting.order_by("created_at")[:100]:
        last = (
            OutboxMessage.objects.filter(kind=KIND, payload__bulk_action_id=str(bulk.pk))
            .order_by("-id")
            .values_list("sent_at", flat=True)
            .first()
        )
        if last is None and bulk.created_at > quiet:
            continue
        if last is not None and last > quiet:
            continue
        if OutboxMessage.objects.filter(
            kind=KIND, payload__bulk_action_id=str(bulk.pk), sent_at__isnull=True
        ).exists():
            continue
        with transaction.atomic():
            _queue(bulk)
        queued += 1
    return queued


# --- reads ----------------------------------------------------------------------------------
def bulk_action_get(*, tenant: Tenant, bulk_action_id: UUID | str) -> BulkAction:
    """The tenant's bulk action; NotFound for another tenant's or an unknown id."""
    try:
        return BulkAction.objects.get(tenant=tenant, pk=bulk_action_id)
    except (BulkAction.DoesNotExist, ValueError, ValidationError):
        raise NotFound("No such bulk action.")


def bulk_actions_of(*, tenant: Tenant) -> QuerySet[BulkAction]:
    """The tenant's bulk actions, newest first."""
    return BulkAction.objects.filter(tenant=tenant).order_by("-created_at", "-pk")


def bulk_action_refusals(bulk: BulkAction) -> QuerySet[BulkActionRun]:
    """The runs the bulk action refused, in selection order, each with its reason."""
    return BulkActionRun.objects.filter(
        bulk_action=bulk, outcome=BulkActionRunOutcome.REFUSED
    ).order_by("position")
