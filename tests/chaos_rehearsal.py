"""The chaos rehearsal: an operator's bad day, bounded, with the product as shipped.

    make chaos-ci      # CI (.ci/run): 100 runs over 45 s, a kill every 8 s
    make chaos         # longer: 400 runs over 180 s, a kill every 6 s (CHAOS_ARGS=...)

It starts a PostgreSQL cluster of its own (initdb on a free port, in a temporary directory,
as the ``postgres`` user when run as root), a Redis of its own (no persistence), the local
publishing service, a web process (gunicorn), a beat and several workers, all with the
shipped settings (the one-minute lease, heartbeats, the beat's rescue). Then, while runs of
the demo ``research`` workflow (an approval, then a publication; each step taking 0.3 s,
as a model call would: tests/chaos_workflows.py) are started over the API and
their approvals decided over the API (about one in ten rejected):

- a worker is SIGKILLed on a schedule, and a new one started in its place;
- the broker is restarted once, dropping its queue (Redis without persistence);
- PostgreSQL is restarted once (``pg_ctl restart -m immediate``: a crash and recovery).

It then waits for every run to end and asserts that every run ended (approved ones
succeeded, rejected ones failed), every hash chain verifies, every published run has exactly
one publication at the provider and no other run has any, and no run waits with an unused
approval. It prints its figures (runs, kills, restarts, take-overs, drain time) and exits
non-zero, naming what broke, if any of that does not hold. Never touches the shared
PostgreSQL or Redis.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
ROOT_USER = os.geteuid() == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- the parts ------------------------------------------------------------------------------
class Postgres:
    """A cluster of the rehearsal's own: initdb, start, restart -m immediate, stop."""

    def __init__(self, root: Path) -> None:
        self.root = root / "postgres"
        self.data = self.root / "data"
        self.port = free_port()
        self.root.mkdir()
        if ROOT_USER:  # postgres refuses to run as root
            shutil.chown(self.root, "postgres", "postgres")
        bindir = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        self.bin = Path(bindir)

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/cairn"

    def _as_owner(self, *args: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *args] if ROOT_USER else list(args)

    def _pg_ctl(self, *args: str) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c max_connections=200 -c fsync=off -c full_page_writes=off"
        )
        subprocess.run(
            self._as_owner(
                str(self.bin / "pg_ctl"), "-D", str(self.data), "-l",
                str(self.root / "server.log"), "-o", options, "-w", "-t", "60", *args,
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip

    def start(self) -> None:
        subprocess.run(
            self._as_owner(
                str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                "--auth=trust", "-E", "UTF8", "--no-sync",
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        self._pg_ctl("start")
        subprocess.run(
            [str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U",
             "postgres", "cairn"],
            check=True,
        )  # fmt: skip

    def restart(self) -> None:
        """A crash and recovery: every connection dropped, in-flight work lost."""
        self._pg_ctl("restart", "-m", "immediate")

    def stop(self) -> None:
        try:
            self._pg_ctl("stop", "-m", "immediate")
        except subprocess.CalledProcessError:
            pass


class Redis:
    """A broker of the rehearsal's own, without persistence: a restart drops its queue."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.log = root / "redis.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=open(self.log, "a"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.1)

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


class Processes:
    """The web process, the beat and the workers: process groups killed at the end."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.logs = root / "logs"
        self.logs.mkdir()
        self.env = env
        self.started: list[subprocess.Popen] = []
        self.workers: list[subprocess.Popen] = []
        self._count = 0

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        self._count += 1
        log = open(self.logs / f"{self._count:03d}-{name}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            args, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.started.append(proc)
        return proc

    def worker(self) -> subprocess.Popen:
        proc = self.spawn(
            "worker",
            [sys.executable, "-m", "celery", "-A", "cairn", "worker", "--pool", "solo",
             "--concurrency", "1", "--hostname", f"chaos{self._count + 1}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel", "WARNING"],
        )  # fmt: skip
        self.workers.append(proc)
        return proc

    def kill_worker(self, rng: random.Random) -> None:
        alive = [w for w in self.workers if w.poll() is None]
        victim = rng.choice(alive)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        self.workers.remove(victim)

    def stop(self) -> None:
        for proc in self.started:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)


# --- over HTTP ------------------------------------------------------------------------------
def call(base: str, path: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode() if body is not None else None,
        method="POST" if body is not None else "GET",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        try:
            return error.code, json.loads(error.read() or b"{}")
        except ValueError:
            return error.code, {}
    except OSError:  # refused, reset, timed out: the web process or its database is away
        return 0, {}


def rejected(run_id: str) -> bool:
    """About one run in ten is rejected by its reviewer (decided by its id, so reproducibly)."""
    return int(hashlib.sha256(run_id.encode()).hexdigest(), 16) % 10 == 0


@dataclass
class Reviewer:
    """Decides every pending approval over the API, as a reviewer at the review queue."""

    base: str
    token: str
    decided: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            status, page = call(self.base, "/approvals?status=pending&limit=500", self.token)
            for request in page.get("results", []) if status == 200 else []:
                reject = rejected(request["run_id"])
                body = {
                    "decision": "reject" if reject else "approve",
                    "artifact_sha256": request["artifact_sha256"],
                    **({"comment": "the chaos reviewer says no"} if reject else {}),
                }
                answer, _ = call(
                    self.base, f"/approvals/{request['id']}/decision", self.token, body
                )
                if answer == 200:
                    self.decided.add(request["run_id"])
            self.stop.wait(0.5)


# --- the rehearsal --------------------------------------------------------------------------
@dataclass
class Figures:
    runs: int = 0
    workers: int = 0
    kills: int = 0
    broker_restarts: int = 0
    database_restarts: int = 0
    takeovers: int = 0
    published: int = 0
    rejected: int = 0
    drain_seconds: float = 0.0
    total_seconds: float = 0.0

    def lines(self) -> list[str]:
        return [
            f"{self.runs} runs ({self.published} published, {self.rejected} rejected) on "
            f"{self.workers} workers",
            f"faults: {self.kills} workers SIGKILLed, {self.broker_restarts} broker restart "
            f"(its queue dropped), {self.database_restarts} PostgreSQL restart (-m immediate)",
            f"take-overs: {self.takeovers} restores; every run ended {self.drain_seconds:.1f} s "
            f"after the last fault (drain); {self.total_seconds:.1f} s in all",
        ]


def environment(
    root: Path, postgres: Postgres, redis: Redis, publishing_url: str, step_seconds: float
) -> dict:
    from checkpoints.crypto import new_key_spec

    kept = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CAIRN_", "DJANGO_", "DATABASE_URL", "CELERY_"))
    }
    return {
        **kept,
        "DJANGO_SETTINGS_MODULE": "cairn.settings",
        "DATABASE_URL": postgres.url,
        "CELERY_BROKER_URL": redis.url,
        "CAIRN_HOME": str(root / "home"),
        "CAIRN_MEDIA_ROOT": str(root / "media"),
        "CAIRN_ENCRYPTION_KEYS": new_key_spec("chaos"),
        "DJANGO_SECRET_KEY": "chaos-" + os.urandom(24).hex(),
        "CAIRN_PUBLISHING_URL": publishing_url,
        "CAIRN_OUTBOUND_ALLOWED_INTERNAL": urlsplit(publishing_url).netloc,  # self-hosted
        "CAIRN_LOG_LEVEL": "WARNING",
        "CAIRN_WORKFLOW_MODULES": "runtime.demo,tests.chaos_workflows",
        "CAIRN_CHAOS_STEP_SECONDS": str(step_seconds),
    }


def cast() -> tuple[str, str]:
    """The tenant and its operator and reviewer; their API tokens."""
    from django.contrib.auth import get_user_model

    from tenants.services import Actor, member_set_role, tenant_create, token_issue

    tenant, _ = tenant_create(slug="chaos", owner_username="chaos-admin")
    tokens = []
    for username, role in (("chaos-operator", "operator"), ("chaos-reviewer", "reviewer")):
        user = get_user_model().objects.create(username=username)
        member_set_role(tenant=tenant, user=user, role=role, actor=Actor.system("chaos"))
        tokens.append(token_issue(tenant=tenant, user=user, actor=Actor.system("chaos"))[1])
    return tokens[0], tokens[1]


def rehearse(args: argparse.Namespace) -> int:  # noqa: C901, PLR0915 - one story, top to bottom
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="cairn-chaos-"))
    os.chmod(root, 0o755)  # the postgres user walks into it
    figures = Figures(workers=args.workers)
    postgres, redis = Postgres(root), Redis(root)
    processes: Processes | None = None
    publishing = None
    reviewer: Reviewer | None = None
    started = time.monotonic()
    try:
        postgres.start()
        redis.start()
        sys.path.insert(0, str(REPO))
        from tests.publishing import PublishingService

        publishing = PublishingService(root / "publishing.json").start()
        env = environment(root, postgres, redis, publishing.url, args.step_seconds)
        os.environ.update(env)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        call_command("sync_workflows", verbosity=0)
        operator, reviewer_token = cast()
        from runtime.management.commands.cairn_up import web_command

        processes = Processes(root, env)
        port = free_port()
        processes.spawn(
            "web",
            # The server make run and production run (cairn/gunicorn.py).
            [*web_command(sys.executable, f"127.0.0.1:{port}"), "--workers", "2",
             "--threads", "4", "--timeout", "120", "--no-control-socket"],
        )  # fmt: skip
        processes.spawn(
            "beat",
            [sys.executable, "-m", "celery", "-A", "cairn", "beat", "-s",
             str(root / "beat-schedule"), "--loglevel", "WARNING"],
        )  # fmt: skip
        for _ in range(args.workers):
            processes.worker()
        base = f"http://127.0.0.1:{port}/api/v1"
        deadline = time.monotonic() + 60
        while call(base, "/runs?limit=1", operator)[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the web process did not answer")
            time.sleep(0.3)
        say(f"up: PostgreSQL :{postgres.port}, Redis :{redis.port}, web :{port}, "
            f"{args.workers} workers, beat")  # fmt: skip

        reviewer = Reviewer(base, reviewer_token)
        threading.Thread(target=reviewer.run, name="reviewer", daemon=True).start()

        # Runs are started over the spread; the faults fall inside it.
        spread = args.spread
        broker_at, database_at = spread * 0.3, spread * 0.6
        run_ids: list[str] = []
        next_kill = args.kill_every
        began = time.monotonic()
        last_fault = began
        while len(run_ids) < args.runs or time.monotonic() - began < spread:
            elapsed = time.monotonic() - began
            if len(run_ids) < args.runs and elapsed >= spread * len(run_ids) / args.runs:
                status, created = call(
                    base,
                    "/runs",
                    operator,
                    {
                        "workflow_type": "research_slow",
                        "inputs": {"question": f"chaos {len(run_ids)}"},
                    },
                )
                if status == 201:
                    run_ids.append(created["id"])
            if elapsed >= next_kill:
                processes.kill_worker(rng)
                processes.worker()
                figures.kills += 1
                next_kill += args.kill_every
                last_fault = time.monotonic()
            if not figures.broker_restarts and elapsed >= broker_at:
                say("restarting the broker (its queue is dropped)")
                redis.restart()
                figures.broker_restarts += 1
                last_fault = time.monotonic()
            if not figures.database_restarts and elapsed >= database_at:
                say("restarting PostgreSQL (-m immediate)")
                postgres.restart()
                figures.database_restarts += 1
                last_fault = time.monotonic()
            time.sleep(0.05)
        figures.runs = len(run_ids)
        say(f"{figures.runs} runs started, {figures.kills} kills so far; draining")

        from django.db import close_old_connections, connection

        from checkpoints.models import Run

        connection.close()  # the restart broke this process's connection too
        final = {"succeeded", "failed", "cancelled"}
        drain_deadline = time.monotonic() + args.drain_timeout
        while True:
            close_old_connections()
            open_runs = Run.objects.filter(pk__in=run_ids).exclude(status__in=final)
            if not open_runs.exists():
                break
            if time.monotonic() > drain_deadline:
                stuck = list(open_runs.values_list("id", "status", "state", "status_reason"))
                for row in stuck[:20]:
                    say(f"stuck: {row}")
                raise AssertionError(f"{len(stuck)} runs did not end within the drain bound")
            time.sleep(0.5)
        figures.drain_seconds = time.monotonic() - last_fault
        reviewer.stop.set()
        figures.total_seconds = time.monotonic() - started
        problems = check(run_ids, publishing, figures)
        for line in figures.lines():
            say(line)
        if problems:
            for problem in problems:
                say(f"BROKEN: {problem}")
            return 1
        say(
            f"held: every run ended, {figures.runs} chains verified, one publication per "
            "published run and none for the others, no run waits with an unused approval"
        )
        return 0
    finally:
        if reviewer is not None:
            reviewer.stop.set()
        if processes is not None:
            processes.stop()
        if publishing is not None:
            publishing.stop()
        redis.stop()
        postgres.stop()
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def check(run_ids: list[str], publishing, figures: Figures) -> list[str]:  # noqa: ANN001
    """The promises, as sentences naming what broke (empty when everything held)."""
    from django.db.models import Sum

    from approvals.models import ApprovalRequest, ApprovalStatus
    from checkpoints.models import Run
    from checkpoints.services.integrity import run_verify

    problems = []
    runs = list(Run.objects.filter(pk__in=run_ids).select_related("tenant"))
    by_target = publishing.stats()["by_target"]
    for run in runs:
        run_id = str(run.pk)
        expected = ("failed", "rejected") if rejected(run_id) else ("succeeded", "done")
        if (run.status, run.state) != expected:
            problems.append(f"run {run_id} ended {run.status} at {run.state}, not {expected}")
        count = by_target.get(f"research/{run_id}", 0)
        if count != (0 if rejected(run_id) else 1):
            problems.append(f"run {run_id} has {count} publications")
        verdict = run_verify(tenant=run.tenant, run_id=run.pk)
        if not verdict["ok"]:
            problems.append(f"run {run_id}'s chain does not verify: {verdict['problems'][:3]}")
    unused = ApprovalRequest.objects.filter(run_id__in=run_ids, status=ApprovalStatus.APPROVED)
    problems += [f"run {r.run_id} still holds an unused approval {r.pk}" for r in unused]
    figures.published = sum(1 for r in runs if r.status == "succeeded")
    figures.rejected = sum(1 for r in runs if rejected(str(r.pk)))
    figures.takeovers = (
        Run.objects.filter(pk__in=run_ids).aggregate(n=Sum("restore_count"))["n"] or 0
    )
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--spread", type=float, default=45.0, help="seconds to start the runs over")
    parser.add_argument("--kill-every", type=float, default=8.0, help="seconds between kills")
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    parser.add_argument("--step-seconds", type=float, default=0.3, help="each step's work")
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--keep", action="store_true", help="keep the directory and logs")
    return rehearse(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
