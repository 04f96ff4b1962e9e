"""Reviewer pages: the review queue and the review page. Thin: selectors, services, templates.

The decision form is a plain POST (it works without JavaScript); htmx only refreshes the
queue and the review page's status line. A refused decision re-renders the review page
with the refusal and status 409, never a silent success.
"""

from __future__ import annotations

import hashlib
import re

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from approvals.forms import DecisionForm, DelegationForm, PreferencesForm, mark_comment_invalid
from approvals.four_eyes import four_eyes_refusal
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.rendering import decode_text, diff_lines, render_artifact, time_left
from approvals.selectors import (
    cited_sources,
    decisions_of,
    previous_request,
    request_get,
    review_queue,
)
from approvals.services import approval_decide
from approvals.services.delegations import (
    delegation_create,
    delegation_revoke,
    delegations_of,
)
from approvals.services.preferences import (
    notification_preferences_get,
    notification_preferences_set,
)
from approvals.services.standing import quorum_progress, reviewer_refusal, reviewers_label
from cairn.errors import CairnError, IntegrityFailure, NotFound
from checkpoints.models import RunStatus
from checkpoints.services.artifacts import artifact_read
from tenants import roles
from tenants.access import console_view

QUEUE_LIMIT = 200


def _get(request: HttpRequest, approval_id: object) -> ApprovalRequest:
    try:
        return request_get(tenant=request.console.tenant, request_id=approval_id, user=request.user)
    except NotFound:
        raise Http404("No such approval request.")


def _run_url(run_id: object) -> str | None:
    try:
        return reverse("console:run_detail", args=[run_id])
    except NoReverseMatch:
        return None


def _page_of(rows: QuerySet, request: HttpRequest, size: int) -> Page:
    """The page ``?page=N`` asks for (the last one past the end, the first one for anything
    that is not a number), so a list is paged instead of cut off."""
    return Paginator(rows, size).get_page(request.GET.get("page"))


@require_GET
@console_view(roles.REVIEWERS)
def inbox(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    queue = review_queue(tenant=request.console.tenant, user=request.user)
    page = _page_of(queue, request, QUEUE_LIMIT)
    for row in page.object_list:
        row.time_left = time_left((row.expires_at - now).total_seconds())
    context = {
        "rows": page.object_list,
        "page": page,
        "refresh_seconds": settings.CAIRN_CONSOLE_REFRESH_SECONDS,
        "limit": QUEUE_LIMIT,
        "delegations": list(delegations_of(tenant=request.console.tenant, user=request.user)),
    }
    template = "approvals/inbox.html#queue" if request.htmx else "approvals/inbox.html"
    return render(request, template, context)


HISTORY_LIMIT = 200


@require_GET
@console_view(roles.REVIEWERS)
def mine(request: HttpRequest) -> HttpResponse:
    """The signed-in reviewer's own decisions in this tenant, newest first."""
    page = _page_of(
        decisions_of(tenant=request.console.tenant, user=request.user), request, HISTORY_LIMIT
    )
    context = {"rows": page.object_list, "page": page, "limit": HISTORY_LIMIT}
    return render(request, "approvals/mine.html", context)


def _why_not(row: ApprovalRequest, user: object, expired: bool) -> str:
    """Why this user cannot decide now ('' when they can)."""
    if row.status != ApprovalStatus.PENDING:
        return f"This request is {row.status}; it takes no more decisions."
    if expired:
        return "This request has expired; a fresh one is raised while the run still waits."
    if row.run.version != row.run_version or row.run.status not in (
        RunStatus.WAITING_APPROVAL,
        RunStatus.RUNNING,
    ):
        return "The run moved on since this request was made; it can no longer be decided."
    not_theirs = reviewer_refusal(request=row, user=user)
    if not_theirs:
        return f"{not_theirs}."
    if row.edited_by_id == user.pk and any(d.approver_id == user.pk for d in row.decisions.all()):
        return (
            "You edited this artifact and your approval of the edit is recorded; another "
            "reviewer decides the edited text now."
        )
    involved = four_eyes_refusal(request=row, user=user)
    if involved:
        return f"{involved}."
    if any(d.approver_id == user.pk for d in row.decisions.all()):
        return "You already decided this request; decisions are final."
    return ""


def _content_context(request: HttpRequest, row: ApprovalRequest) -> dict[str, object]:
    """The artifact as shown, the sha256 of exactly those bytes, and the diff."""
    tenant, actor = request.console.tenant, request.console.actor
    try:
        artifact, data = artifact_read(
            tenant=tenant, artifact_id=row.artifact_id, actor=actor, run_id=row.run_id
        )
    except IntegrityFailure as exc:
        return {"content_error": exc.detail}
    shown_sha = hashlib.sha256(data).hexdigest()
    context: dict[str, object] = {
        "rendered": render_artifact(data, artifact.media_type),
        "shown_sha256": shown_sha,
        "previous": None,
        "diff": None,
    }
    text = decode_text(data)
    context["sources"] = _sources_listed(row, text or "")
    # Approve with edits: a text artifact is offered in a textarea, as it is.
    if text is not None and "\x00" not in text and rendered_kind(context) != "binary":
        context["editable_text"] = text
        context["line_endings"] = "crlf" if "\r\n" in text else "lf"
    previous = previous_request(row)
    if previous is None:
        return context
    context["previous"] = previous
    if previous.artifact_sha256 == shown_sha:
        context["diff_same"] = True
        return context
    try:
        _, old = artifact_read(
            tenant=tenant, artifact_id=previous.artifact_id, actor=actor, run_id=row.run_id
        )
    except IntegrityFailure as exc:
        context["diff_error"] = exc.detail
        return context
    old_text, new_text = decode_text(old), decode_text(data)
    if old_text is None or new_text is None:
        context["diff_error"] = "One of the two artifacts is not text, so there is no diff."
        return context
    context["diff"] = diff_lines(
        old_text,
        new_text,
        old_label=f"{'shown' if row.edited_from_sha256 else 'previous'} "
        f"{previous.artifact_sha256[:12]}",
        new_label=f"{'edited' if row.edited_from_sha256 else 'under review'} {shown_sha[:12]}",
    )
    return context


def rendered_kind(context: dict[str, object]) -> str:
    rendered = context.get("rendered")
    return getattr(rendered, "kind", "binary")


# A draft lists its sources as "[1] name (sha256 0123456789ab)" (the demo's draft_answer).
SOURCE_LINE = re.compile(r"^\[(\d+)\] (.{1,200}?) \(sha256 ([0-9a-f]{8,64})\)", re.M)


def _sources_listed(row: ApprovalRequest, text: str) -> list[dict[str, object]]:
    """The sources of the checkpoint under review, each labelled as the artifact cites it
    ("[1] name") when its listing names the source's sha256, else by its sha256."""
    cited = {sha: f"[{n}] {name}" for n, name, sha in SOURCE_LINE.findall(text)}
    listed = []
    for artifact in cited_sources(row):
        label = next(
            (said for sha, said in cited.items() if artifact.sha256.startswith(sha)),
            f"source {artifact.sha256[:12]}",
        )
        listed.append({"artifact": artifact, "label": label})
    return listed


def _status_context(row: ApprovalRequest, user: object) -> dict[str, object]:
    """What the status line shows: the status as it is now (a request past its expiry is
    shown expired before the sweep marks it), why no decision can be made, and the request
    that replaced this one, if any."""
    now = timezone.now()
    expired = row.status == ApprovalStatus.EXPIRED or row.expires_at <= now
    shown = row.status
    if expired and row.status in (ApprovalStatus.PENDING, ApprovalStatus.APPROVED):
        shown = ApprovalStatus.EXPIRED
    newer = None
    if shown in (ApprovalStatus.EXPIRED, ApprovalStatus.SUPERSEDED):
        newer = (
            ApprovalRequest.objects.filter(
                run_id=row.run_id,
                action=row.action,
                created_at__gt=row.created_at,
                status__in=(ApprovalStatus.PENDING, ApprovalStatus.APPROVED),
            )
            .order_by("-created_at")
            .first()
        )
    return {
        "row": row,
        "shown_status": shown,
        "shown_status_label": ApprovalStatus(shown).label,
        "newer": newer,
        "time_left": time_left((row.expires_at - now).total_seconds()),
        "expired": expired,
        "why_not": _why_not(row, user, expired),
        "quorum": quorum_progress(row),
        "reviewers": reviewers_label(row),
        "refresh_seconds": settings.CAIRN_CONSOLE_REFRESH_SECONDS,
    }


def _review_context(
    request: HttpRequest,
    row: ApprovalRequest,
    comment: str = "",
    comment_error: str = "",
    edited_text: str | None = None,
) -> dict[str, object]:
    context: dict[str, object] = {
        **_status_context(row, request.user),
        "row": row,
        "run": row.run,
        # Only people who may open the run page get a link to it (a reviewer would get a 403).
        "run_url": _run_url(row.run_id) if request.console.can(roles.OPERATE) else None,
        "decisions": list(row.decisions.all()),
        **_content_context(request, row),
    }
    # The form always carries the hash of the bytes rendered on this very page.
    sha = context.get("shown_sha256", "")
    context["form"] = DecisionForm(initial={"artifact_sha256": sha, "comment": comment})
    if comment_error:
        mark_comment_invalid(context["form"], comment_error)
    if edited_text is not None and "editable_text" in context:
        context["editable_text"] = edited_text  # a refused edit is offered again, as typed
        context["edit_open"] = True
    return context


@require_GET
@console_view(roles.REVIEWERS)
def review(request: HttpRequest, approval_id: object) -> HttpResponse:
    row = _get(request, approval_id)
    return render(request, "approvals/review.html", _review_context(request, row))


@require_GET
@console_view(roles.REVIEWERS)
def status(request: HttpRequest, approval_id: object) -> HttpResponse:
    """The review page's status line (htmx polls it), so expiry shows while the page is open."""
    row = _get(request, approval_id)
    # ``polled``: once no decision can be made, the answer also replaces the decision form
    # (an out-of-band swap), so the page stops offering Approve and Reject.
    context = {**_status_context(row, request.user), "polled": True}
    return render(request, "approvals/review.html#status", context)


@require_GET
@console_view(roles.REVIEWERS)
def source(request: HttpRequest, approval_id: object, artifact_id: object) -> HttpResponse:
    """One source the artifact under review cites, for the reviewer to check it against:
    only a source artifact of the checkpoint under review (anything else is a 404), read
    through the audited artifact read."""
    row = _get(request, approval_id)
    artifact = next((a for a in cited_sources(row) if a.pk == artifact_id), None)
    if artifact is None:
        raise Http404("The request under review cites no such source.")
    try:
        artifact, data = artifact_read(
            tenant=request.console.tenant,
            artifact_id=artifact.pk,
            actor=request.console.actor,
            run_id=row.run_id,
        )
    except IntegrityFailure as exc:
        context = {"row": row, "artifact": artifact, "content_error": exc.detail}
        return render(request, "approvals/source.html", context)
    context = {
        "row": row,
        "artifact": artifact,
        "rendered": render_artifact(data, artifact.media_type),
        "shown_sha256": hashlib.sha256(data).hexdigest(),
    }
    return render(request, "approvals/source.html", context)


@require_POST
@console_view(roles.REVIEWERS)
def decide(request: HttpRequest, approval_id: object) -> HttpResponse:
    row = _get(request, approval_id)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        comment_errors = form.errors.get("comment")
        context = _review_context(
            request,
            row,
            request.POST.get("comment", "")[:4000],
            comment_error=" ".join(comment_errors or ()),
        )
        if not comment_errors or len(form.errors) > 1:
            context["refusal"] = "The decision form is incomplete; nothing was decided."
        return render(request, "approvals/review.html", context, status=400)
    edited_text = form.edited("edited_text" in request.POST)
    try:
        decision = approval_decide(
            tenant=request.console.tenant,
            request_id=row.pk,
            decision=form.cleaned_data["decision"],
            artifact_sha256=form.cleaned_data["artifact_sha256"],
            comment=form.cleaned_data["comment"],
            edited_text=edited_text,
            actor=request.console.actor,
        )
    except NotFound:
        raise Http404("No such approval request.")
    except CairnError as refusal:
        row = _get(request, approval_id)  # reload: an expiry was recorded, a run moved
        at_comment = "comment" in (refusal.fields or {})
        context = _review_context(
            request,
            row,
            form.cleaned_data["comment"],
            comment_error=refusal.detail if at_comment else "",
            edited_text=edited_text,
        )
        context["refusal"] = "" if at_comment else refusal.detail
        context["refusal_code"] = refusal.code
        return render(request, "approvals/review.html", context, status=refusal.status)
    if edited_text is not None:
        new = _get(request, decision.request_id)
        progress = quorum_progress(new)
        if new.status == ApprovalStatus.APPROVED:
            said = "Approved with your edit. The run continues with exactly the edited artifact."
        else:
            said = (
                f"Your edit is a new artifact ({new.artifact_sha256[:12]}) and your approval of "
                f"it is recorded: {progress.approved} of {progress.required}. The quorum starts "
                "again on the edited text."
            )
        messages.success(request, said)
        return redirect("approvals:review", approval_id=new.pk)
    if decision.decision == "approve":
        row = _get(request, approval_id)
        if row.status == ApprovalStatus.APPROVED:
            messages.success(request, "Approved. The run continues with exactly this artifact.")
        else:
            messages.success(
                request, "Your approval is recorded; the request needs more approvals."
            )
    else:
        why = "your comment" if decision.comment else "the rejection"
        messages.success(request, f"Rejected. The run ends with {why} as the reason.")
    return redirect("approvals:review", approval_id=row.pk)


@console_view(roles.REVIEWERS)
def notifications(request: HttpRequest) -> HttpResponse:
    """The signed-in reviewer's notification preferences in this tenant."""
    if request.method not in ("GET", "POST"):
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    tenant, status, refusal = request.console.tenant, 200, ""
    prefs = notification_preferences_get(tenant=tenant, user=request.user)
    form = PreferencesForm(initial={"email": prefs.email, "chat": prefs.chat})
    if request.method == "POST":
        form = PreferencesForm(request.POST)
        if not form.is_valid():
            status, refusal = 400, "The preferences form is incomplete; nothing was changed."
        else:
            data = form.cleaned_data
            url = "" if data["forget_chat_url"] else (data["chat_url"].strip() or None)
            try:
                notification_preferences_set(
                    tenant=tenant,
                    user=request.user,
                    actor=request.console.actor,
                    email=data["email"],
                    chat=data["chat"],
                    chat_url=url,
                )
            except CairnError as error:
                status = error.status
                refusal = " ".join([error.detail, *(error.fields or {}).values()])
            else:
                messages.success(request, "Your notification preferences are saved.")
                return redirect("approvals:notifications")
    context = {"prefs": prefs, "form": form, "refusal": refusal}
    return render(request, "approvals/notifications.html", context, status=status)


@console_view(roles.REVIEWERS)
def delegations(request: HttpRequest) -> HttpResponse:
    """The signed-in reviewer's delegations: give one, see those given and received."""
    if request.method not in ("GET", "POST"):
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    tenant, status, refusal = request.console.tenant, 200, ""
    form = DelegationForm()
    if request.method == "POST":
        form = DelegationForm(request.POST)
        if not form.is_valid():
            status, refusal = 400, "The delegation form is incomplete; nothing was changed."
        else:
            data = form.cleaned_data
            ends_at = data["ends_at"]  # aware: read in TIME_ZONE (UTC)
            try:
                row = delegation_create(
                    tenant=tenant,
                    delegate_username=data["delegate"],
                    ends_at=ends_at,
                    reason=data["reason"],
                    actor=request.console.actor,
                )
            except CairnError as error:
                status = error.status
                refusal = " ".join([error.detail, *(error.fields or {}).values()])
            else:
                messages.success(
                    request,
                    f"{row.delegate.get_username()} decides in your place until "
                    f"{row.ends_at:%Y-%m-%d %H:%M} UTC.",
                )
                return redirect("approvals:delegations")
    rows = list(delegations_of(tenant=tenant, user=request.user))
    context = {"rows": rows, "form": form, "refusal": refusal, "me": request.user.pk}
    return render(request, "approvals/delegations.html", context, status=status)


@require_POST
@console_view(roles.REVIEWERS)
def delegation_end(request: HttpRequest, delegation_id: object) -> HttpResponse:
    try:
        delegation_revoke(
            tenant=request.console.tenant,
            delegation_id=delegation_id,
            actor=request.console.actor,
        )
    except NotFound:
        raise Http404("No such delegation of yours.")
    messages.success(request, "The delegation has ended.")
    return redirect("approvals:delegations")
