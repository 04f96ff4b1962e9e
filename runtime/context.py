"""What a step sees: its run's inputs, the evidence of earlier checkpoints, its budget, a
model client that accounts for every call, and helpers that add evidence.

Evidence is cumulative: each checkpoint carries every artifact reference (by name), every
validator result (by name) and every earlier step's output, so a restore reads only the
latest checkpoint.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import transaction

from cairn.errors import (
    ConcurrentCheckpointWrite,
    IntegrityFailure,
    LeaseHeld,
    PayloadTooLarge,
    RunNotActive,
    StorageUnavailable,
)
from checkpoints.models import Artifact, ArtifactKind, Run
from checkpoints.services.artifacts import artifact_content, artifact_store
from checkpoints.services.checkpoints import BUDGET_USED_KEYS, CommitRequest, checkpoint_commit
from telemetry import tracing

from .errors import BudgetExhaustedError, LeaseLost
from .model_client import Completion, ModelClient

if TYPE_CHECKING:
    from tenants.services import Actor

    from .definition import StepSpec
    from .lease import LeaseKeeper

log = logging.getLogger("cairn.runtime")


def evidence_normalize(evidence: dict[str, Any] | None) -> dict[str, Any]:
    evidence = copy.deepcopy(evidence or {})
    return {
        "artifacts": list(evidence.get("artifacts", [])),
        "validators": list(evidence.get("validators", [])),
        "tool_results": list(evidence.get("tool_results", [])),
        "outputs": dict(evidence.get("outputs", {})),
    }


def put_by_name(items: list[dict[str, Any]], item: dict[str, Any]) -> None:
    for index, existing in enumerate(items):
        if existing.get("name") == item["name"]:
            items[index] = item
            return
    items.append(item)


class AccountingModel:
    """Wraps a ModelClient: refuses a call once the token or cost budget is spent, and
    charges each call's tokens and cost to the run as soon as it returns."""

    def __init__(self, client: ModelClient, context: StepContext) -> None:
        self.client = client
        self.name = client.name
        self.provider = getattr(client, "provider", "") or type(client).__name__
        self._context = context

    def complete(self, *, prompt: str, system: str = "", max_tokens: int = 512) -> Completion:
        left = self._context.budget_remaining()
        if left.get("tokens") == 0 or left.get("cost") == 0:
            which = "tokens" if left.get("tokens") == 0 else "cost"
            raise BudgetExhaustedError(f"budget exhausted: no {which} left for a model call")
        # A GenAI span: the model, the tokens and the cost, never the prompt or the answer.
        with tracing.model_span(
            model=self.name, provider=self.provider, max_tokens=max_tokens
        ) as span:
            completion = self.client.complete(prompt=prompt, system=system, max_tokens=max_tokens)
            tracing.model_answered(
                span,
                model=completion.model,
                input_tokens=completion.prompt_tokens,
                output_tokens=completion.completion_tokens,
                cost=completion.cost,
            )
        self._context._charge(tokens_used=completion.tokens, cost_used=completion.cost)
        self._context.model_calls += 1
        self._context.model_call_log.append(
            {
                "model": str(completion.model)[:200],
                "provider": str(self.provider)[:100],
                "input_tokens": completion.prompt_tokens,
                "output_tokens": completion.completion_tokens,
                "cost": completion.cost,
                "prompt": self._kept(f"{system}\n\n{prompt}" if system else prompt),
                "response": self._kept(completion.text),
            }
        )
        return completion

    def _kept(self, text: str) -> dict[str, str] | None:
        """The text as an encrypted artifact (step history), or None when storage is down:
        the call was made and charged either way, so its record must not fail the step."""
        try:
            artifact, _ = artifact_store(
                tenant=self._context.tenant,
                data=text.encode("utf-8"),
                media_type="text/plain; charset=utf-8",
                kind=ArtifactKind.MODEL_CONTEXT,
            )
        except (StorageUnavailable, PayloadTooLarge):
            return None
        return {"id": str(artifact.id), "sha256": artifact.sha256}


class StepContext:
    """Passed to every step function. Only the helpers below change what gets committed."""

    def __init__(
        self,
        *,
        run: Run,
        spec: StepSpec,
        envelope: dict[str, Any],
        used: dict[str, Any],
        keeper: LeaseKeeper,
        model: ModelClient,
        actor: Actor,
        code_version: str = "",
    ) -> None:
        self.run_id = run.pk
        self.tenant = run.tenant
        self.workflow_type = run.workflow_type
        self.workflow_version = run.workflow_version
        self.state = spec.state
        self.step = spec.name
        self._run = run
        self._keeper = keeper
        self._actor = actor
        self._code_version = code_version
        self._inputs = envelope.get("inputs") or {}
        self.evidence = evidence_normalize(envelope.get("evidence"))
        self.side_effects: list[dict[str, Any]] = copy.deepcopy(envelope.get("side_effects", []))
        self.used = dict(used)
        self.model_calls = 0
        self.model_call_log: list[dict[str, Any]] = []  # step history: each call's record
        self.model = AccountingModel(model, self)
        self.log = log

    # --- reading ----------------------------------------------------------------------------
    @property
    def actor(self) -> Actor:
        """Who this worker's writes are recorded as (checkpoints, operations, audit)."""
        return self._actor

    @property
    def inputs(self) -> dict[str, Any]:
        """The run's normalized inputs (``values`` of the genesis checkpoint)."""
        return copy.deepcopy(self._inputs.get("values", {}))

    @property
    def objective_ref(self) -> str | None:
        return self._inputs.get("objective_ref")

    @property
    def attempts_used(self) -> int:
        """Step executions the run has used so far, this one included."""
        return int(self.used.get("attempts_used", 0))

    def output_of(self, step: str) -> Any:
        """The accepted output of an earlier step (KeyError if it has none)."""
        return copy.deepcopy(self.evidence["outputs"][step])

    def artifact_ref(self, name: str) -> dict[str, Any]:
        for ref in self.evidence["artifacts"]:
            if ref.get("name") == name:
                return dict(ref)
        raise KeyError(f"no artifact named '{name}' in the run's evidence")

    def artifact_names(self, prefix: str = "") -> list[str]:
        return [
            r["name"] for r in self.evidence["artifacts"] if r.get("name", "").startswith(prefix)
        ]

    def artifact_bytes(self, name: str) -> bytes:
        """The content of an evidence artifact, checked against the sha256 the evidence
        names and the stored one. Raises KeyError or IntegrityFailure."""
        ref = self.artifact_ref(name)
        artifact = Artifact.objects.filter(tenant=self.tenant, pk=ref["id"]).first()
        if artifact is None or artifact.sha256 != ref["sha256"]:
            raise IntegrityFailure(f"Artifact '{name}' ({ref['id']}) is missing or was replaced.")
        return artifact_content(artifact)

    def artifact_text(self, name: str) -> str:
        return self.artifact_bytes(name).decode("utf-8")

    def budget_remaining(self) -> dict[str, Any]:
        """What is left of each limit (None = unlimited), counting this step's usage."""
        limits = self._run.budget_limits or {}
        left: dict[str, Any] = {}
        for name in ("attempts", "tokens", "cost"):
            limit = limits.get(f"max_{name}")
            used = self.used.get(f"{name}_used", 0)
            left[name] = None if limit is None else max(0, round(limit - used, 6))
        left["deadline"] = limits.get("deadline")
        return left

    # --- adding evidence ----------------------------------------------------------------
    def store_artifact(
        self,
        name: str,
        data: bytes | str,
        *,
        media_type: str = "text/plain; charset=utf-8",
        kind: str = ArtifactKind.OTHER,
    ) -> dict[str, Any]:
        """Store content (encrypted, deduplicated) and add it to the evidence under
        ``name``, replacing an earlier artifact of that name. Returns the reference."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        artifact, _ = artifact_store(
            tenant=self.tenant, data=data, media_type=media_type, kind=kind
        )
        ref = {"id": str(artifact.id), "sha256": artifact.sha256, "name": name, "kind": kind}
        put_by_name(self.evidence["artifacts"], ref)
        return dict(ref)

    def record_validator(self, name: str, *, passed: bool, detail: str = "") -> None:
        """Record a validator result (replacing an earlier result of the same name)."""
        item: dict[str, Any] = {"name": name, "passed": bool(passed), "step": self.step}
        if detail:
            item["detail"] = detail[:1000]
        put_by_name(self.evidence["validators"], item)

    def heartbeat(self) -> None:
        """Renew the lease now (it is also renewed in the background). Raises LeaseLost."""
        self._keeper.renew()

    def job_record(self, *, idempotency_key: str, job_id: str) -> None:
        """Record the provider's job id of this run's long-running operation before polling
        it, so a worker that dies while polling is followed by one that observes the same
        job (``effect_job`` does this). Raises OperationStateConflict (another job id is
        recorded, or the outcome is final) or NotFound."""
        from runtime.services.operations import operation_get, operation_record_job

        operation = operation_get(
            tenant=self.tenant, run_id=self.run_id, idempotency_key=idempotency_key
        )
        operation_record_job(operation_id=operation.id, job_id=job_id, actor=self._actor)

    def _charge(self, **deltas: float) -> None:
        self.used = self._keeper.charge(**deltas)

    # --- committing under the step's lease (the effect API's checkpoints) --------------------
    def commit_side_effects(
        self,
        side_effects: list[dict[str, Any]],
        *,
        pending_action: str | None = None,
        with_commit: Callable[[], object] | None = None,
    ) -> None:
        """Commit a checkpoint at the step's state whose side-effects group is
        ``side_effects``, under this step's lease and run version, then make it the
        context's ``side_effects``. Its budgets are the run's usage so far; the other groups
        carry forward from the parent.

        The checkpoint names no step: only the step's own commit, after it returns, marks
        the step accepted. ``pending_action`` names the operation about to be sent;
        ``with_commit`` runs in the same transaction before the checkpoint is written (the
        effect API marks its operation pending there, so both are written or neither).
        Raises LeaseLost when the run moved on; nothing is written then.
        """
        keeper = self._keeper
        # The renewal thread also writes under the lease version: keep it still while the
        # version moves.
        keeper.stop_renewing()
        try:
            used = keeper.usage_now()
            with transaction.atomic():
                if with_commit is not None:
                    with_commit()
                result = checkpoint_commit(
                    tenant=self.tenant,
                    run_id=self.run_id,
                    head=keeper.head,
                    request=CommitRequest(
                        expected_version=keeper.version,
                        state=self.state,
                        step="",
                        envelope={
                            "side_effects": side_effects,
                            "budgets": {key: used[key] for key in BUDGET_USED_KEYS},
                        },
                        actor=self._actor,
                        lease_owner=keeper.owner,
                        pending_action=pending_action,
                        code_version=self._code_version,
                        is_evidence=True,
                    ),
                )
            keeper.committed(version=result.run_version, used=used, head=result.head)
            self.side_effects[:] = copy.deepcopy(side_effects)
        except (ConcurrentCheckpointWrite, LeaseHeld, RunNotActive) as exc:
            raise LeaseLost(exc.detail)
        finally:
            keeper.start_renewing()
