from django.db import models


class PeriodicJob(models.Model):
    """One scheduled job's claim: who started it last, and until when that run holds it.

    A run of the job starts only by winning a conditional UPDATE of this row (services), so
    two schedulers sending the same job, or a message redelivered, start it once.
    """

    name = models.CharField(max_length=100, primary_key=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    # While a run is in progress no other starts; a run whose worker died stops holding the
    # job when this passes.
    running_until = models.DateTimeField(null=True, blank=True)
    holder = models.CharField(max_length=200, blank=True)
    runs = models.PositiveBigIntegerField(default=0)
    skipped = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"periodic job {self.name}"
