"""Cairn settings. Everything comes from environment variables with safe defaults.

With nothing set, Cairn runs embedded: SQLite, filesystem artifact storage, a Celery
transport on the filesystem, and keys generated into a local directory that git ignores
(``CAIRN_HOME``, default ``./var``). Every variable is documented in docs/deployment.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from cairn.local_files import local_secret

BASE_DIR = Path(__file__).resolve().parent.parent


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


CAIRN_HOME = Path(env("CAIRN_HOME", str(BASE_DIR / "var")))
PRODUCTION = env("CAIRN_ENV", "development") == "production"

SECRET_KEY = env("DJANGO_SECRET_KEY") or local_secret(CAIRN_HOME / "secret_key", nbytes=50)
# Off unless asked for: even the embedded default (``make run``) shows Cairn's own error
# pages, never Django's debug pages (they list the URL configuration and settings).
DEBUG = env_bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = [h for h in env("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in env("DJANGO_CSRF_TRUSTED_ORIGINS").split(",") if o]

INSTALLED_APPS = [
    # Django's admin, its sign-in throttled as the console's (cairn.admin).
    "cairn.admin.CairnAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_htmx",
    "template_partials",
    "guardian",
    # The project: commands that span the apps (rotate_keys).
    "cairn",
    "tenants",
    "telemetry",
    "checkpoints",
    "runtime",
    # LangGraph's saver and its thread store; only langgraph_store.saver imports LangGraph.
    "langgraph_store",
    "approvals",
    "api",
    "console",
    "retention",
    "observability",
    "scheduling",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "cairn.middleware.ContentSecurityPolicyMiddleware",
    # API and /metrics answer an unhandled error in the API's shape, DEBUG or not.
    "cairn.middleware.ApiErrorsMiddleware",
    # Before anything reads the body: a chunked body is read here within the limit (or 411).
    "cairn.middleware.ChunkedBodyMiddleware",
    "cairn.middleware.RefuseNulMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "cairn.urls"
WSGI_APPLICATION = "cairn.wsgi.application"
ASGI_APPLICATION = "cairn.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------
# Every SQLite database, however it is named (the default path, CAIRN_SQLITE_PATH or a
# sqlite:// DATABASE_URL), runs in WAL mode with IMMEDIATE transactions and a busy timeout,
# so concurrent writers queue for the lock instead of failing with "database is locked"
# mid-transaction (which surfaced as 500s).
SQLITE_OPTIONS = {
    "timeout": 30,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}
if env("DATABASE_URL"):
    DATABASES = {"default": dj_database_url.parse(env("DATABASE_URL"), conn_max_age=60)}
else:
    CAIRN_HOME.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env("CAIRN_SQLITE_PATH", str(CAIRN_HOME / "cairn.sqlite3")),
        }
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {**SQLITE_OPTIONS, **DATABASES["default"].get("OPTIONS", {})}
    # A persistent connection keeps nothing worth keeping on SQLite and holds the WAL open.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    # Django's ModelBackend, finding the account by its NFKC case-folded name.
    "tenants.backends.UsernameKeyBackend",
    "guardian.backends.ObjectPermissionBackend",
]
GUARDIAN_RAISE_403 = False
ANONYMOUS_USER_NAME = None  # no guardian anonymous user: anonymous callers see nothing

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "console:login"
LOGIN_REDIRECT_URL = "console:home"
LOGOUT_REDIRECT_URL = "console:login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # whitenoise warns on every request when it is missing
WHITENOISE_USE_FINDERS = True  # serve static/ directly when collectstatic has not run
STATICFILES_DIRS = [BASE_DIR / "static"]
MEDIA_ROOT = Path(env("CAIRN_MEDIA_ROOT", str(CAIRN_HOME / "media")))
# Artifacts: the filesystem under CAIRN_MEDIA_ROOT (embedded), or an S3-compatible bucket
# shared by every machine (CAIRN_ARTIFACT_STORAGE=s3). Either way Cairn seals the bytes first.
CAIRN_ARTIFACT_STORAGE = env("CAIRN_ARTIFACT_STORAGE", "filesystem")
CAIRN_S3_BUCKET = env("CAIRN_S3_BUCKET")
CAIRN_S3_ENDPOINT_URL = env("CAIRN_S3_ENDPOINT_URL")  # empty: AWS itself
CAIRN_S3_REGION = env("CAIRN_S3_REGION")
CAIRN_S3_PREFIX = env("CAIRN_S3_PREFIX")
CAIRN_S3_ACCESS_KEY_ID_REF = env("CAIRN_S3_ACCESS_KEY_ID_REF")  # e.g. env:S3_ACCESS_KEY_ID
CAIRN_S3_SECRET_ACCESS_KEY_REF = env("CAIRN_S3_SECRET_ACCESS_KEY_REF")
CAIRN_S3_ADDRESSING_STYLE = env("CAIRN_S3_ADDRESSING_STYLE")  # "path" for most self-hosted


def artifact_storage() -> dict:
    if CAIRN_ARTIFACT_STORAGE == "filesystem":
        return {"BACKEND": "django.core.files.storage.FileSystemStorage"}
    if CAIRN_ARTIFACT_STORAGE != "s3":
        raise ImproperlyConfigured(
            f"CAIRN_ARTIFACT_STORAGE is '{CAIRN_ARTIFACT_STORAGE}'; use filesystem or s3."
        )
    if not CAIRN_S3_BUCKET:
        raise ImproperlyConfigured("CAIRN_ARTIFACT_STORAGE=s3 needs CAIRN_S3_BUCKET.")
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    options = {
        "bucket_name": CAIRN_S3_BUCKET,
        "endpoint_url": CAIRN_S3_ENDPOINT_URL or None,
        "region_name": CAIRN_S3_REGION or None,
        "location": CAIRN_S3_PREFIX,
        "access_key_ref": CAIRN_S3_ACCESS_KEY_ID_REF,
        "secret_key_ref": CAIRN_S3_SECRET_ACCESS_KEY_REF,
        # Names are content addresses: the same name is the same bytes, so no HEAD first.
        "file_overwrite": True,
        "default_acl": None,
        "querystring_auth": False,
        # Reads spill to a temporary file past 1 MiB; uploads go in 8 MiB parts, one at a
        # time, so a large artifact is never buffered whole a second time.
        "max_memory_size": 1024 * 1024,
        "transfer_config": TransferConfig(
            multipart_threshold=64 * 1024 * 1024,
            multipart_chunksize=8 * 1024 * 1024,
            max_concurrency=1,
            use_threads=False,
        ),
        "client_config": Config(
            s3={"addressing_style": CAIRN_S3_ADDRESSING_STYLE or "auto"},
            retries={"max_attempts": 5, "mode": "standard"},
        ),
    }
    return {"BACKEND": "cairn.storage.ArtifactS3Storage", "OPTIONS": options}


STORAGES = {
    "default": artifact_storage(),
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}

# --- Request size limits ---------------------------------------------------------------
CAIRN_MAX_REQUEST_BYTES = env_int("CAIRN_MAX_REQUEST_BYTES", 1024 * 1024)
CAIRN_MAX_ARTIFACT_BYTES = env_int("CAIRN_MAX_ARTIFACT_BYTES", 10 * 1024 * 1024)
CAIRN_MAX_ENVELOPE_BYTES = env_int("CAIRN_MAX_ENVELOPE_BYTES", 256 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = max(CAIRN_MAX_REQUEST_BYTES, CAIRN_MAX_ARTIFACT_BYTES)
FILE_UPLOAD_MAX_MEMORY_SIZE = DATA_UPLOAD_MAX_MEMORY_SIZE

# --- Encryption --------------------------------------------------------------------------
# "kid:base64key,kid2:base64key"; the first key encrypts, all of them decrypt. Without the
# variable, a key is generated once into CAIRN_HOME/encryption_keys (never committed).
CAIRN_ENCRYPTION_KEYS = env("CAIRN_ENCRYPTION_KEYS")
CAIRN_KEY_FILE = Path(env("CAIRN_KEY_FILE", str(CAIRN_HOME / "encryption_keys")))

# --- Signed evidence (approvals.signing) -------------------------------------------------
# The deployment's Ed25519 private key (PEM) that signs evidence bundles. Unset, one is
# generated on first use into CAIRN_HOME/evidence_signing_key.pem (never committed); set, the
# file must exist (`python manage.py evidence_key --create` writes one) and is never made up.
CAIRN_EVIDENCE_KEY_FILE = Path(
    env("CAIRN_EVIDENCE_KEY_FILE", str(CAIRN_HOME / "evidence_signing_key.pem"))
)
CAIRN_EVIDENCE_KEY_GENERATE = not env("CAIRN_EVIDENCE_KEY_FILE")

# --- Runtime -----------------------------------------------------------------------------
CAIRN_LEASE_SECONDS = env_int("CAIRN_LEASE_SECONDS", 60)
# Long-polls (GET /runs/{id}/next?wait=) one tenant may hold at once in one web process. A
# sleeping wait holds no thread (cairn.asgi), only a coroutine and its client's connection.
CAIRN_WAITS_PER_TENANT = env_int("CAIRN_WAITS_PER_TENANT", 100)
# Worker heartbeats (runtime.heartbeats): each worker process beats this often; one silent
# for CAIRN_WORKER_DEAD_SECONDS is dead, and its runs are taken over without waiting for
# their leases to expire. A clock further than CAIRN_CLOCK_SKEW_LIMIT_SECONDS from the
# database's is logged and shown on the health page.
CAIRN_WORKER_HEARTBEAT_SECONDS = float(env("CAIRN_WORKER_HEARTBEAT_SECONDS", "1"))
CAIRN_WORKER_DEAD_SECONDS = float(env("CAIRN_WORKER_DEAD_SECONDS", "3"))
CAIRN_CLOCK_SKEW_LIMIT_SECONDS = float(env("CAIRN_CLOCK_SKEW_LIMIT_SECONDS", "2"))
CAIRN_OUTBOX_CLAIM_SECONDS = env_int("CAIRN_OUTBOX_CLAIM_SECONDS", 30)
CAIRN_DISPATCH_ON_COMMIT = env_bool("CAIRN_DISPATCH_ON_COMMIT", True)
CAIRN_CONSOLE_REFRESH_SECONDS = env_int("CAIRN_CONSOLE_REFRESH_SECONDS", 5)
# The most runs one bulk action (console or POST /api/v1/bulk-actions) may select; a larger
# selection is refused with 400 (runtime.services.bulk).
CAIRN_BULK_ACTION_MAX_RUNS = env_int("CAIRN_BULK_ACTION_MAX_RUNS", 1000)
# A worker's claim on a bulk action, renewed after each chunk of runs; an unfinished action
# whose claim expired (its worker died) is queued again by the beat's bulk-actions-rescue.
CAIRN_BULK_ACTION_CLAIM_SECONDS = env_int("CAIRN_BULK_ACTION_CLAIM_SECONDS", 120)
# --- Reviewer notifications (approvals.notify) ---------------------------------------------
# Where a notification's link points: the console as reviewers reach it.
CAIRN_PUBLIC_URL = env("CAIRN_PUBLIC_URL", "http://127.0.0.1:8000")
# A pending request's reviewers are reminded once when less than this is left (0: never).
CAIRN_APPROVAL_REMIND_SECONDS = env_int("CAIRN_APPROVAL_REMIND_SECONDS", 3600)
# Email goes through Django's SMTP backend to CAIRN_EMAIL_HOST; without one no email is
# planned (chat messages still are).
EMAIL_HOST = env("CAIRN_EMAIL_HOST")
EMAIL_PORT = env_int("CAIRN_EMAIL_PORT", 25)
EMAIL_HOST_USER = env("CAIRN_EMAIL_USER")
# The SMTP password is a secret reference (env:NAME or file:NAME), resolved at each send.
CAIRN_EMAIL_PASSWORD_REF = env("CAIRN_EMAIL_PASSWORD_REF")
EMAIL_USE_TLS = env_bool("CAIRN_EMAIL_STARTTLS", False)
EMAIL_USE_SSL = env_bool("CAIRN_EMAIL_SSL", False)
EMAIL_TIMEOUT = env_int("CAIRN_EMAIL_TIMEOUT_SECONDS", 10)
DEFAULT_FROM_EMAIL = env("CAIRN_EMAIL_FROM", "cairn@localhost")
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
CAIRN_EMAIL_NOTIFICATIONS = env_bool("CAIRN_EMAIL_NOTIFICATIONS", bool(EMAIL_HOST))
CAIRN_STALLED_OPERATION_SECONDS = env_int("CAIRN_STALLED_OPERATION_SECONDS", 600)
# A run created over the API (or the console) without max_attempts gets this limit, so a step
# that keeps failing cannot retry without end.
CAIRN_DEFAULT_MAX_ATTEMPTS = env_int("CAIRN_DEFAULT_MAX_ATTEMPTS", 25)
# --- Retention and observability (retention/, observability/) ---------------------------
CAIRN_RETENTION_BATCH_SIZE = env_int("CAIRN_RETENTION_BATCH_SIZE", 500)
CAIRN_RETENTION_INTERVAL_SECONDS = env_int("CAIRN_RETENTION_INTERVAL_SECONDS", 3600)
CAIRN_METRICS_TOKEN = env("CAIRN_METRICS_TOKEN")
CAIRN_METRICS_ALLOWED_NETWORKS = [
    n.strip()
    for n in env("CAIRN_METRICS_ALLOWED_NETWORKS", "127.0.0.1/32,::1/128").split(",")
    if n.strip()
]
CAIRN_ALERT_RESTORES = env_int("CAIRN_ALERT_RESTORES", 3)
CAIRN_ALERT_OUTBOX_LAG_SECONDS = env_int("CAIRN_ALERT_OUTBOX_LAG_SECONDS", 60)
CAIRN_METRICS_FLUSH_SECONDS = env_int("CAIRN_METRICS_FLUSH_SECONDS", 5)
# The run page links to the run's trace: a Jaeger, Tempo or Grafana URL with {trace_id}.
# (Tracing itself is configured only by the standard OTEL_* variables: docs/operations.md.)
CAIRN_TRACE_URL_TEMPLATE = env("CAIRN_TRACE_URL_TEMPLATE")
# The local publishing service the demo's publish step writes to (a provider adapter).
CAIRN_PUBLISHING_URL = env("CAIRN_PUBLISHING_URL", "http://127.0.0.1:8765")
CAIRN_PUBLISHING_TOKEN_REF = env("CAIRN_PUBLISHING_TOKEN_REF")  # e.g. env:PUBLISHING_TOKEN
CAIRN_PROVIDER_TIMEOUT_SECONDS = float(env("CAIRN_PROVIDER_TIMEOUT_SECONDS", "5"))
# How long an approval request stays open when its creator names no expiry.
CAIRN_APPROVAL_TTL_SECONDS = env_int("CAIRN_APPROVAL_TTL_SECONDS", 24 * 3600)
# The approvals implementation behind the store's and the engine's approvals port
# (checkpoints.approvals_port.ApprovalsPort), by import path, as AUTHENTICATION_BACKENDS
# names its backends. Approvals sit above checkpoints and runtime, so those layers never
# import the approvals app: the project wires it here. Not an environment variable.
CAIRN_APPROVALS_PORT = "approvals.port.port"
CAIRN_MODEL_CLIENT = env("CAIRN_MODEL_CLIENT", "local")
CAIRN_MODEL_BASE_URL = env("CAIRN_MODEL_BASE_URL")
CAIRN_MODEL_NAME = env("CAIRN_MODEL_NAME", "gpt-4o-mini")
CAIRN_MODEL_API_KEY_REF = env("CAIRN_MODEL_API_KEY_REF")  # a secret reference, e.g. env:NAME
CAIRN_MODEL_TIMEOUT_SECONDS = env_int("CAIRN_MODEL_TIMEOUT_SECONDS", 60)
CAIRN_MODEL_COST_PER_1K_TOKENS = float(env("CAIRN_MODEL_COST_PER_1K_TOKENS", "0.002"))
# Modules that declare workflows in Python (imported by workers, commands and run creation).
CAIRN_WORKFLOW_MODULES = [
    m.strip() for m in env("CAIRN_WORKFLOW_MODULES", "runtime.demo").split(",") if m
]
# Steps one worker runs back to back while it holds a run's lease, before handing over.
CAIRN_STEPS_PER_TASK = env_int("CAIRN_STEPS_PER_TASK", 20)
CAIRN_RETRY_DELAY_SECONDS = env_int("CAIRN_RETRY_DELAY_SECONDS", 30)
# How long a periodic job's run holds the job, beyond twice its interval, if its worker
# dies mid-run; scheduling.services.
CAIRN_PERIODIC_JOB_LEASE_SECONDS = env_int("CAIRN_PERIODIC_JOB_LEASE_SECONDS", 30)
# The fault injector fault points call (cairn/faults.py): none, and deliberately not read from
# the environment, so no deployment can crash or pause itself at a fault point. Only the test
# settings (tests/settings.py) name one.
CAIRN_FAULT_INJECTOR: str | None = None

# --- Celery --------------------------------------------------------------------------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict = {}
CELERY_BROKER_TRANSPORT: str | None = None
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport, writing each message aside and renaming it into place,
    # so a polling worker never reads half of one (cairn.broker).
    CELERY_BROKER_TRANSPORT = "cairn.broker:Transport"
    _broker_dir = Path(env("CAIRN_BROKER_DIR", str(CAIRN_HOME / "broker")))
    for _sub in ("out", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "processed_folder": str(_broker_dir / "processed"),
        # Without it kombu writes its exchange table into ./control of the cwd.
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        # How often an idle worker looks for a message (kombu's default: every second). It
        # is the whole wait between a command and the worker taking it (an approval's next
        # step, a started run), so it is kept short: a folder listing ten times a second.
        "polling_interval": 0.1,
    }
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # Longer than any countdown or lease, so a slow ack never causes a redelivery.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
# The queue tasks go to and workers consume (every process of one deployment must agree).
CELERY_TASK_DEFAULT_QUEUE = env("CAIRN_TASK_QUEUE", "celery")
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BEAT_SCHEDULE = {
    "outbox-sweep": {"task": "checkpoints.outbox_sweep", "schedule": 5.0},
    "runs-rescue": {"task": "checkpoints.runs_rescue", "schedule": 15.0},
    # Every second: the runs of workers whose heartbeat stopped (runtime.rescue). Expires
    # with its interval, so busy workers never find a backlog of them.
    "dead-workers-rescue": {
        "task": "checkpoints.runs_rescue_dead_workers",
        "schedule": CAIRN_WORKER_HEARTBEAT_SECONDS,
        "options": {"expires": max(5.0, 5 * CAIRN_WORKER_HEARTBEAT_SECONDS)},
    },
    "runs-cancel-sweep": {"task": "checkpoints.runs_cancel_sweep", "schedule": 30.0},
    # Bulk actions whose worker died or whose command was lost (runtime.services.bulk).
    "bulk-actions-rescue": {"task": "runtime.bulk_actions_rescue", "schedule": 30.0},
    "webhooks-deliver": {"task": "checkpoints.webhooks_deliver", "schedule": 5.0},
    "retention-apply": {
        "task": "retention.apply",
        "schedule": float(CAIRN_RETENTION_INTERVAL_SECONDS),
    },
    "metrics-rollup": {"task": "observability.metrics_rollup", "schedule": 60.0},
    "approvals-expire": {"task": "approvals.expire_due", "schedule": 30.0},
}

# --- REST framework ---------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.permissions.HasTenantRole"],
    "DEFAULT_PARSER_CLASSES": ["api.parsers.LimitedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "api.negotiation.BlankAcceptIsAny",
    "DEFAULT_SCHEMA_CLASS": "api.autoschema.CairnAutoSchema",
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Cairn API",
    "DESCRIPTION": "Durable checkpoints and resume for AI-agent workflows.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Several models have a "status": name each set of choices so clients get stable enums.
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "checkpoints.models.RunStatus",
        "ExecutionEnum": "checkpoints.models.Execution",
        "ArtifactKindEnum": "checkpoints.models.ArtifactKind",
        "OperationStatusEnum": "checkpoints.models.OperationStatus",
        "ApprovalStatusEnum": "approvals.models.ApprovalStatus",
        "DecisionKindEnum": "approvals.models.DecisionKind",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "api.schema.add_common_responses",
    ],
}

# --- Security ------------------------------------------------------------------------------
# Sign-in throttling (tenants.throttle): failures per username+address, and per address.
CAIRN_LOGIN_MAX_FAILURES = env_int("CAIRN_LOGIN_MAX_FAILURES", 5)
CAIRN_LOGIN_MAX_FAILURES_PER_ADDRESS = env_int("CAIRN_LOGIN_MAX_FAILURES_PER_ADDRESS", 50)
CAIRN_LOGIN_WINDOW_SECONDS = env_int("CAIRN_LOGIN_WINDOW_SECONDS", 900)
# Internal destinations (loopback, private networks…) outbound requests may reach anyway
# (cairn.outbound): host, host:port, network/prefix or [v6]:port, comma-separated. Embedded,
# the demo's local publishing service; in production nothing unless listed.
CAIRN_OUTBOUND_ALLOWED_INTERNAL = [
    entry.strip()
    for entry in env(
        "CAIRN_OUTBOUND_ALLOWED_INTERNAL", "" if PRODUCTION else "127.0.0.1:8765"
    ).split(",")
    if entry.strip()
]
# ``file:NAME`` secret references resolve only to files under this directory (cairn.secrets).
CAIRN_SECRETS_DIR = env("CAIRN_SECRETS_DIR")
# How long an invitation's set-password link works (Django's reset token), in seconds.
PASSWORD_RESET_TIMEOUT = env_int("CAIRN_INVITE_LINK_SECONDS", 3 * 24 * 3600)
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads nothing from it: the token goes in hx-headers
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "cairn.logging.JsonFormatter"}},
    "handlers": {
        # stdout: one JSON object per line, what log shippers and `docker logs` expect.
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json",
            "stream": "ext://sys.stdout",
        }
    },
    "loggers": {
        "cairn": {"handlers": ["console"], "level": env("CAIRN_LOG_LEVEL", "INFO")},
        "django.request": {"handlers": ["console"], "level": "ERROR"},
    },
}
