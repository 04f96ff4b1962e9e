"""Where a 2 KB commit's time goes (not a test): the commit, then each of its parts on its
own, in one process on a scratch PostgreSQL database.

    .venv/bin/python bench/commit_profile.py [--rounds 500] [--size 2000] [--cprofile 1000]
        [--pyinstrument 1000]

Prints the median time of each part, and with ``--cprofile N`` the functions that N
commits spend the most cumulative time in (``--pyinstrument N``: pyinstrument's call tree,
from PyPI). docs/performance.md quotes it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import recreate_database, setup_django, time_each  # noqa: E402

DB = "cairn_commit_profile"


def median_ms(operation: Callable[[], object], rounds: int) -> float:
    return statistics.median(time_each(lambda _i: operation(), rounds, warmup=min(50, rounds)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--size", type=int, default=2000)
    parser.add_argument("--cprofile", type=int, default=0, metavar="N")
    parser.add_argument("--pyinstrument", type=int, default=0, metavar="N")
    parser.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE the commit")
    parser.add_argument(
        "--http",
        type=int,
        default=0,
        metavar="N",
        help="profile N commits through the whole HTTP stack in process, by layer",
    )
    args = parser.parse_args()
    rounds = args.rounds
    recreate_database(DB)
    setup_django(DB)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.db import connection

    from bench import cairn_side
    from checkpoints import crypto
    from checkpoints import envelope as env
    from checkpoints.models import Run
    from checkpoints.services.checkpoints import _check_client_groups, checkpoint_build
    from checkpoints.services.reads import run_get

    tenant = cairn_side.tenant()
    committer = cairn_side.Committer(tenant, args.size)
    run_id = committer.run.id
    run = run_get(tenant=tenant, run_id=run_id)
    full = checkpoint_build(
        run=run,
        checkpoint_id=uuid.uuid4(),
        sequence=2,
        parent=(None, "0" * 64),
        state="s",
        step="s",
        groups=committer.groups,
    )
    canonical = env.canonical_json(full)

    def raw_select() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT * FROM checkpoints_run r JOIN checkpoints_workflowdefinition w "
                "ON w.id = r.workflow_id WHERE r.id = %s AND r.tenant_id = %s",
                [run_id, tenant.id],
            )
            cursor.fetchone()

    parts = [
        ("the whole commit (checkpoint_commit, head passed)", committer),
        ("read the run with its workflow (ORM)", lambda: run_get(tenant=tenant, run_id=run_id)),
        ("the same read on a raw cursor", raw_select),
        ("read the run alone (ORM)", lambda: Run.objects.get(tenant=tenant, pk=run_id)),
        ("JSON Schema validation", lambda: env.validate(full)),
        ("credential scan and size check", lambda: _check_client_groups(committer.groups)),
        ("RFC 8785 canonical JSON", lambda: env.canonical_json(full)),
        (
            "zlib level 1 and AES-GCM seal",
            lambda: crypto.seal(
                canonical,
                tenant_id=tenant.id,
                table="t",
                row_id=uuid.uuid4(),
                field="f",
                compress=True,
            ),
        ),
    ]
    print(f"Median of {rounds} rounds, {args.size} B state, PostgreSQL on loopback:")
    for name, operation in parts:
        print(f"  {name:40} {median_ms(operation, rounds):7.3f} ms")
    if args.cprofile:
        profile = cProfile.Profile()
        profile.runcall(lambda: [committer() for _ in range(args.cprofile)])
        print(f"\ncProfile of {args.cprofile} commits, by cumulative time:")
        pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
    if args.explain:
        explain(tenant, committer)
    if args.http:
        http_layers(tenant, args.size, args.http)
    if args.pyinstrument:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0001)
        profiler.start()
        for _ in range(args.pyinstrument):
            committer()
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False, show_all=False))
    return 0


# Where a function's own time (cProfile's tottime) is counted, first match of its file.
LAYERS = (
    ("DRF (request, parsers, renderers, serializers, views)", "/rest_framework/"),
    ("Django (handler, middleware, URL resolving, responses)", "/django/"),
    ("psycopg (the database round trips)", "/psycopg/"),
    ("the JSON codecs", "/json/"),
    ("OpenTelemetry and its instrumentations", "/opentelemetry/"),
    ("Cairn's commit (checkpoints/)", "/checkpoints/"),
    ("Cairn's API layer (api/, tenants/)", ("/api/", "/tenants/")),
    ("cryptography, jsonschema and the rest", ""),
)


def http_layers(tenant, size: int, commits: int) -> None:  # noqa: ANN001
    """``commits`` commits as a runner sends them (POST /runs/{id}/checkpoints, bearer
    token, JSON body), through Django's whole stack in this process (no socket, no server):
    the share of each layer in their own time, and the statements of one commit."""
    import json

    from django.contrib.auth import get_user_model
    from django.core.wsgi import get_wsgi_application

    from bench import cairn_side
    from bench.common import payload
    from tenants.services import Actor, member_set_role, token_issue

    user, _ = get_user_model().objects.get_or_create(username="profile-client")
    member_set_role(tenant=tenant, user=user, role="operator", actor=Actor.system("bench"))
    _, token = token_issue(tenant=tenant, user=user, actor=Actor.system("bench"))
    run = cairn_side.new_run(tenant)
    groups = cairn_side.groups(payload(size))
    application = get_wsgi_application()  # what gunicorn calls, without a socket
    path = f"/api/v1/runs/{run.id}/checkpoints"
    version = [run.version]
    last = [b""]  # the last answer

    def commit() -> None:
        body = json.dumps(
            {"expected_version": version[0], "state": "s", "step": "s", "envelope": groups}
        ).encode()
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": path,
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "HTTP_HOST": "127.0.0.1",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_AUTHORIZATION": f"Bearer {token}",
        }
        answered = []
        chunks = application(environ, lambda status, headers: answered.append(status))
        data = b"".join(chunks)
        assert answered[0].startswith("201"), (answered, data[:300])
        last[0] = data
        version[0] = json.loads(data)["run_version"]

    for _ in range(20):
        commit()
    from django.db import connection as db

    totals: dict[str, list[float]] = {}

    def timed(execute, sql, params, many, context):  # noqa: ANN001, ANN202
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            key = " ".join(sql.split())[:90]
            totals.setdefault(key, []).append(1000 * (time.perf_counter() - started))

    with db.execute_wrapper(timed):
        for _ in range(50):
            commit()
    print("\nOne HTTP commit's statements (median of 50, client side, round trip included):")
    for sql, times in totals.items():
        print(f"  {statistics.median(times):7.3f} ms  {sql}")
    unprofiled = statistics.median(time_each(lambda _i: commit(), commits, warmup=0))
    print(
        f"\nThe HTTP commit in process, no profiler: median {unprofiled:.3f} ms ({commits} commits)"
    )

    def client_work() -> None:  # what commit() does besides calling the application
        json.dumps({"expected_version": version[0], "state": "s", "step": "s", "envelope": groups})
        json.loads(last[0])

    cpu_by_part(commit, client_work, commits)
    profile = cProfile.Profile()
    profile.runcall(lambda: [commit() for _ in range(commits)])
    stats = pstats.Stats(profile)
    own: dict[str, float] = {name: 0.0 for name, _ in LAYERS}
    for (filename, _line, _name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        for name, marks in LAYERS:
            if any(mark in filename for mark in (marks if isinstance(marks, tuple) else (marks,))):
                own[name] += tottime
                break
    total = sum(own.values())
    print(f"\nThe HTTP commit in process ({commits} commits, {size} B state), own time by layer:")
    print(f"  {'all':58} {1000 * total / commits:7.3f} ms a commit")
    for name, seconds in sorted(own.items(), key=lambda item: -item[1]):
        print(f"  {name:58} {1000 * seconds / commits:7.3f} ms  {100 * seconds / total:5.1f} %")
    rest = sorted(
        (
            (tottime, filename)
            for (filename, _l, _n), (_c, _nc, tottime, _ct, _cs) in stats.stats.items()
            if not any(
                mark in filename
                for _, marks in LAYERS[:-1]
                for mark in (marks if isinstance(marks, tuple) else (marks,))
            )
        ),
        reverse=True,
    )
    django_own = sorted(
        (
            (tottime, f"{filename[filename.find('/django/') :]}:{line} {name}")
            for (filename, line, name), (_c, _nc, tottime, _ct, _cs) in stats.stats.items()
            if "/django/" in filename
        ),
        reverse=True,
    )
    print("  Django's own time, by function:")
    for tottime, where in django_own[:12]:
        print(f"    {1000 * tottime / commits:7.3f} ms  {where[-90:]}")
    print("  of the rest, by file:")
    for tottime, filename in rest[:8]:
        print(f"    {1000 * tottime / commits:7.3f} ms  {filename[-70:]}")


def cpu_by_part(commit: Callable[[], None], client_work: Callable[[], None], commits: int) -> None:
    """The CPU time (this process's, no profiler) of ``commits`` HTTP commits, and of the
    short path's parts inside them: the rest is Django's handler, its middleware and the
    URL resolving around the view. CPU, not wall time: the database's waits are not in it,
    so this is what the web process spends of the two cores a commit."""
    from api import commit_route

    parts = {
        "_plain_request": "the request's shape (no statement)",
        "runner_read": "the token and the run's head (one statement, the models built)",
        "_plain_body": "the JSON body, parsed and checked",
        "checkpoint_commit_by_runner": "the commit (envelope, seal, one statement)",
        "_json": "the answer rendered",
    }
    spent = dict.fromkeys(parts, 0.0)
    originals = {name: getattr(commit_route, name) for name in parts}

    def counted(name: str) -> Callable:
        def call(*args: object, **kwargs: object) -> object:
            started = time.process_time()
            try:
                return originals[name](*args, **kwargs)
            finally:
                spent[name] += time.process_time() - started

        return call

    for name in parts:
        setattr(commit_route, name, counted(name))
    try:
        started = time.process_time()
        for _ in range(commits):
            commit()
        total = time.process_time() - started
    finally:
        for name, original in originals.items():
            setattr(commit_route, name, original)
    started = time.process_time()
    for _ in range(commits):
        client_work()
    client = time.process_time() - started
    rows = {
        "all (the bench client's own JSON work taken out)": total - client,
        **{what: spent[name] for name, what in parts.items()},
        "the rest: Django's handler, middleware, URL resolving, the view": (
            total - client - sum(spent.values())
        ),
    }
    print(f"\nThe HTTP commit in process, CPU time a commit ({commits} commits, no profiler):")
    for what, seconds in rows.items():
        print(f"  {what:66} {1000 * seconds / commits:7.3f} ms")


def explain(tenant, committer) -> None:  # noqa: ANN001
    """The commit's one statement under EXPLAIN (ANALYZE, BUFFERS), rolled back."""
    from django.db import connection, transaction

    from cairn import clock
    from checkpoints.services import commit_sql
    from checkpoints.services.checkpoints import CommitRequest, _commit_plan
    from tenants.services import Actor

    request = CommitRequest(
        expected_version=committer.version,
        state="s",
        step="s",
        envelope=committer.groups,
        actor=Actor.system("bench"),
    )
    head = commit_sql.head_read(tenant_id=tenant.id, run_id=committer.run.id)
    write = _commit_plan(tenant, head, request, lease_now=clock.now()).write
    params = commit_sql._commit_params(write, embedded=False)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + commit_sql._PG_COMMIT, params)
            print("\nEXPLAIN (ANALYZE, BUFFERS) of the commit statement (rolled back):")
            for (line,) in cursor.fetchall():
                print("  " + line)
        transaction.set_rollback(True)


if __name__ == "__main__":
    raise SystemExit(main())
