"""The sweep's records: each run of ``zoekt_gitlab_sync``, and what it saw.

Not GitLab's tables: the control plane's own, named ``zoekt_gitlab_*``.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class Sweep(models.Model):
    """One walk of GitLab (``zoekt_gitlab_sweeps``): where it stands, and what it changed.

    ``cursor`` holds where an interrupted run resumes (the phase, the last root group
    done, the last project id written); ``counts`` what it wrote, skipped and removed.
    The database refuses a second running sweep.
    """

    class Kind(models.TextChoices):
        FULL = "full"
        DELTA = "delta"

    class State(models.TextChoices):
        RUNNING = "running"
        COMPLETE = "complete"
        FAILED = "failed"

    class Phase(models.TextChoices):
        GROUPS = "groups"
        USERS = "users"
        PROJECTS = "projects"
        REMOVAL = "removal"
        DONE = "done"

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.FULL)
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    phase = models.CharField(max_length=16, choices=Phase.choices, default=Phase.GROUPS)
    gitlab_url = models.CharField(max_length=1024)
    started_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    cursor = models.JSONField(default=dict, blank=True)
    counts = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "zoekt_gitlab_sweeps"
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["state"],
                condition=Q(state="running"),
                name="zoekt_gitlab_one_running_sweep",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} sweep {self.id} ({self.state}, {self.phase})"


class Seen(models.Model):
    """That a sweep saw an object in GitLab (``zoekt_gitlab_seen``): one row per object,
    rewritten by each sweep, so that a complete sweep removes what it did not see."""

    class Kind(models.IntegerChoices):
        NAMESPACE = 1, "namespace"
        PROJECT = 2, "project"

    id = models.BigAutoField(primary_key=True)
    kind = models.SmallIntegerField(choices=Kind.choices)
    object_id = models.BigIntegerField()
    sweep_id = models.BigIntegerField()

    class Meta:
        db_table = "zoekt_gitlab_seen"
        constraints = [
            models.UniqueConstraint(fields=["kind", "object_id"], name="zoekt_gitlab_seen_object")
        ]
        indexes = [models.Index(fields=["kind", "sweep_id"], name="zoekt_gitlab_seen_by_sweep")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.object_id} seen by sweep {self.sweep_id}"


class HookEvent(models.Model):
    """A system hook GitLab sent (``zoekt_gitlab_hook_events``), kept until a worker has
    refetched the object it names. ``event_uuid`` (``X-Gitlab-Event-UUID``, else
    ``Idempotency-Key``) is unique: a redelivered hook is stored once."""

    class State(models.TextChoices):
        PENDING = "pending"
        DONE = "done"
        FAILED = "failed"

    id = models.BigAutoField(primary_key=True)
    event_uuid = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    event_name = models.CharField(max_length=64)
    #: The id of the project or group the event names.
    object_id = models.BigIntegerField()
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    received_at = models.DateTimeField()
    #: Not before (a push's statistics are refetched after a debounce).
    process_after = models.DateTimeField()
    processed_at = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(default=0)
    outcome = models.CharField(max_length=64, blank=True, default="")
    error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "zoekt_gitlab_hook_events"
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["event_uuid"],
                condition=Q(event_uuid__isnull=False),
                name="zoekt_gitlab_hook_event_once",
            )
        ]
        indexes = [
            models.Index(
                fields=["state", "process_after"],
                condition=Q(state="pending"),
                name="zoekt_gitlab_hooks_pending",
            )
        ]

    def __str__(self) -> str:
        return f"{self.event_name} {self.object_id} ({self.state})"
