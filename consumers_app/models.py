"""The engine's own tables: the lab's state, kept across restarts of runlab."""
from django.db import models


class SavedLab(models.Model):
    """The lab as a scenario (groups, strategies, modes, consumer counts and faults,
    producer rates, offline brokers): runlab starts from it unless ``--fresh``."""

    name = models.CharField(max_length=64, unique=True, default="default")
    scenario = models.JSONField()
    # The number the lab's next consumer is named by (c<N>): names go on from here after a
    # restart, so the history never shows two different consumers under one name.
    next_client = models.PositiveIntegerField(default=1)
    saved_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} (saved {self.saved_at:%Y-%m-%d %H:%M:%S})"
