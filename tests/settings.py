"""Test settings: the real settings, with a throwaway home and key, and fast password hashing.

Environment variables set here are inherited by the worker processes tests start, so they
share the database, keys and broker of the test run.
"""

import os
import tempfile

os.environ.setdefault("CAIRN_HOME", tempfile.mkdtemp(prefix="cairn-test-"))
os.environ.setdefault("CELERY_BROKER_URL", "memory://")

from checkpoints.crypto import new_key_spec  # noqa: E402

os.environ.setdefault("CAIRN_ENCRYPTION_KEYS", new_key_spec("test1"))

from cairn.settings import *  # noqa: E402, F403
from cairn.settings import CAIRN_HOME, DATABASES  # noqa: E402

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Commit latency samples are written at once, so no buffered sample outlives its test.
CAIRN_METRICS_FLUSH_SECONDS = 0
# Console pages poll every second, so a browser test sees a change well inside its wait.
CAIRN_CONSOLE_REFRESH_SECONDS = 1
# A file, not :memory:, so threads and worker processes share the test database.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["TEST"] = {"NAME": str(CAIRN_HOME / "test.sqlite3")}
else:
    # One test database per test process, so two suites on one server never collide.
    # Worker processes started by tests read the name from connection.settings_dict.
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}
# Fault points (cairn/faults.py) are live here, armed by the environment a test gives a
# subprocess (tests/faults.py); the production settings leave them inert.
CAIRN_FAULT_INJECTOR = "tests.faults.inject"
# Crash tests: the web server subprocess stalls in the middle of writing a file.
if os.environ.get("CAIRN_TEST_STORAGE_STALL"):
    STORAGES = {**STORAGES, "default": {"BACKEND": "tests.storage.StallingStorage"}}  # noqa: F405
# Tests' receivers and the local publishing service listen on loopback (cairn.outbound);
# the outbound tests set this to nothing to see every internal address refused.
CAIRN_OUTBOUND_ALLOWED_INTERNAL = ["127.0.0.1"]
