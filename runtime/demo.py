"""The demo workflow ``research`` (version 1), run on the deterministic local model over the
fixture sources in ``runtime/fixtures``:

collect_sources → extract_claims → draft_answer → validate_citations → request_approval
(a reviewer approves the draft) → publish → done (or rejected).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from checkpoints.models import ArtifactKind, Run
from runtime.effects import effect_perform
from tenants.models import Tenant
from tenants.services import Actor

from .context import StepContext
from .definition import Workflow
from .errors import PermanentStepError

FIXTURES = Path(__file__).resolve().parent / "fixtures"

research = Workflow("research", version="1")


def fixture_sources() -> dict[str, str]:
    return {path.stem: path.read_text() for path in sorted(FIXTURES.glob("*.md"))}


def _sentences(text: str) -> list[str]:
    body = " ".join(line for line in text.splitlines() if line and not line.startswith("#"))
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", body) if s.strip()]


@research.step("collect_sources", next="extract_claims")
def collect_sources(ctx: StepContext) -> dict[str, Any]:
    available = fixture_sources()
    wanted = ctx.inputs.get("sources") or list(available)
    missing = [name for name in wanted if name not in available]
    if missing:
        raise PermanentStepError(f"unknown fixture sources: {', '.join(missing)}")
    for name in wanted:
        ctx.store_artifact(
            f"source:{name}",
            available[name],
            media_type="text/markdown; charset=utf-8",
            kind=ArtifactKind.SOURCE,
        )
    return {"sources": wanted}


@research.step("extract_claims", next="draft_answer")
def extract_claims(ctx: StepContext) -> dict[str, Any]:
    claims = []
    for index, name in enumerate(ctx.output_of("collect_sources")["sources"], start=1):
        text = ctx.artifact_text(f"source:{name}")  # verified against its sha256
        note = ctx.model.complete(
            system="Extract the claims a careful reader can rely on.", prompt=text
        )
        for sentence in _sentences(text)[:3]:
            claims.append({"source": name, "cite": index, "claim": sentence})
        claims.append({"source": name, "cite": index, "claim": note.text, "model": True})
    ctx.store_artifact(
        "claims", json.dumps(claims, indent=2), media_type="application/json", kind="tool_result"
    )
    return {"claims": len(claims)}


@research.step("draft_answer", next="validate_citations")
def draft_answer(ctx: StepContext) -> dict[str, Any]:
    question = ctx.inputs.get("question", "What do the sources say?")
    claims = json.loads(ctx.artifact_text("claims"))
    summary = ctx.model.complete(
        system="Answer the question using only the claims given; cite them.",
        prompt=question + "\n" + "\n".join(c["claim"] for c in claims),
    )
    sources = ctx.output_of("collect_sources")["sources"]
    lines = [f"# {question}", "", summary.text, ""]
    lines += [f"- {c['claim']} [{c['cite']}]" for c in claims if not c.get("model")]
    lines += ["", "## Sources", ""]
    for index, name in enumerate(sources, start=1):
        ref = ctx.artifact_ref(f"source:{name}")
        lines.append(f"[{index}] {name} (sha256 {ref['sha256'][:12]})")
    draft = ctx.store_artifact(
        "draft", "\n".join(lines) + "\n", media_type="text/markdown; charset=utf-8", kind="draft"
    )
    return {"draft_sha256": draft["sha256"], "model": summary.model}


@research.step("validate_citations", next="request_approval")
def validate_citations(ctx: StepContext) -> dict[str, Any]:
    draft = ctx.artifact_text("draft")
    body, _, listing = draft.partition("## Sources")
    cited = {int(n) for n in re.findall(r"\[(\d+)\]", body)}
    known = {int(n) for n in re.findall(r"^\[(\d+)\]", listing, flags=re.M)}
    problems = []
    if not cited:
        problems.append("the draft cites nothing")
    if cited - known:
        problems.append(f"citations without a source: {sorted(cited - known)}")
    if known - cited:
        problems.append(f"sources never cited: {sorted(known - cited)}")
    ctx.record_validator("citations", passed=not problems, detail="; ".join(problems) or "ok")
    if problems:
        raise PermanentStepError("citation check failed: " + "; ".join(problems))
    return {"citations": len(cited)}


research.approval(
    "request_approval", next="publish", rejected="rejected", artifact="draft", action="publish"
)


@research.effect("publish", next="done", action="publish")
def publish(ctx: StepContext) -> dict[str, Any]:
    """Publish the approved draft to the publishing service, exactly once: reserved under an
    idempotency key, checkpointed pending, confirmed, reconciled after any crash."""
    draft = ctx.artifact_ref("draft")
    done = effect_perform(
        ctx,
        target=f"research/{ctx.run_id}",
        request={
            "title": ctx.inputs.get("question", "What do the sources say?"),
            "body": ctx.artifact_text("draft"),
            "draft_sha256": draft["sha256"],
        },
    )
    return {
        "published": True,
        "provider_operation_id": done.provider_operation_id,
        "url": done.result.get("url"),
        "draft_sha256": draft["sha256"],
    }


research.terminal("done", "rejected")

DEMO_QUESTIONS = (
    "Why do hikers build cairns, and when should they not?",
    "How do cairns help navigation above the tree line?",
    "What harm can building cairns do to a stream?",
)


def demo_seed_runs(*, tenant: Tenant) -> int:
    """Start the demo research runs in ``tenant`` unless it already has research runs.
    Returns how many were started. Each is created by ``run_create`` (its own transaction)
    and picked up by the workers through the outbox."""
    from runtime.registry import workflow_ensure_registered
    from runtime.services.runs import run_create

    if Run.objects.filter(tenant=tenant, workflow_type=research.workflow_type).exists():
        return 0
    workflow_ensure_registered(research.workflow_type, research.version)
    for question in DEMO_QUESTIONS:
        run_create(
            tenant=tenant,
            workflow_type=research.workflow_type,
            workflow_version=research.version,
            inputs={"question": question},
            objective_ref="demo:research",
            budget={"max_attempts": 20, "max_tokens": 50000, "max_cost": 1.0},
            actor=Actor.system("seed_demo"),
        )
    return len(DEMO_QUESTIONS)
