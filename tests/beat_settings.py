"""Test settings with every scheduled job due each second (the two-beats test)."""

from tests.settings import *  # noqa: F403
from tests.settings import CELERY_BEAT_SCHEDULE

BEAT_SECONDS = 1.0
CELERY_BEAT_SCHEDULE = {
    key: {**entry, "schedule": BEAT_SECONDS} for key, entry in CELERY_BEAT_SCHEDULE.items()
}
