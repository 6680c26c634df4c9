"""GitLab's Zoekt tables and the slice of GitLab's core model that planning reads.

Table names, column names, types, defaults, enum values, unique constraints
and ON DELETE behaviour mirror GitLab (reference section 1). Where GitLab has
a database default the field carries ``db_default`` so the schema says the
same as GitLab's; where GitLab's model default differs from its database
default (``retries_left``) both are kept. Django does not emit ON DELETE
clauses itself, so migration 0002 sets them on the foreign keys.
"""

from __future__ import annotations

import re
from datetime import datetime

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Length, Now
from django.db.models.lookups import GreaterThan, LessThanOrEqual

from zoekt import app_settings, capacity, clock
from zoekt.clock import EPOCH
from zoekt.metadata_schema import (
    validate_enabled_namespace_metadata,
    validate_index_metadata,
    validate_node_metadata,
)
from zoekt.querysets import (
    EnabledNamespaceQuerySet,
    IndexQuerySet,
    MoveQuerySet,
    NamespaceQuerySet,
    NodeQuerySet,
    NodeShutdownQuerySet,
    ReplicaQuerySet,
    RepositoryQuerySet,
    TaskQuerySet,
)


class ClockStampedModel(models.Model):
    """Stamps ``updated_at`` from ``zoekt.clock`` on every save (not Django's auto_now).

    Bulk ``update()`` calls set ``updated_at=clock.now()`` themselves.
    """

    class Meta:
        abstract = True

    def save(self, *args, **kwargs) -> None:
        if hasattr(self, "updated_at"):
            self.updated_at = clock.now()
            update_fields = kwargs.get("update_fields")
            if update_fields is not None:
                kwargs["update_fields"] = {*update_fields, "updated_at"}
        super().save(*args, **kwargs)


def _json_object_default() -> dict:
    return {}


def _services_default() -> list[int]:
    return [Node.Service.ZOEKT]


# ----------------------------------------------------------------------------
# GitLab's core model: the slice that planning reads
# ----------------------------------------------------------------------------


class Namespace(ClockStampedModel):
    """A GitLab namespace: a group, a user namespace, or a project's own namespace."""

    class Type(models.TextChoices):
        GROUP = "Group"
        PROJECT = "Project"
        USER = "User"

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=255)
    path = models.CharField(max_length=255)
    type = models.CharField(
        max_length=255, choices=Type.choices, db_default=Type.GROUP, default=Type.GROUP
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    # Ancestor ids from the root down to this namespace itself, as in GitLab.
    traversal_ids = ArrayField(models.BigIntegerField(), db_default=[], default=list, blank=True)
    visibility_level = models.IntegerField(db_default=20, default=20)
    archived = models.BooleanField(db_default=False, default=False)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    objects = NamespaceQuerySet.as_manager()

    class Meta:
        db_table = "namespaces"
        indexes = [
            models.Index(fields=["type", "id"], name="namespaces_type_id"),
            models.Index(fields=["traversal_ids"], name="namespaces_traversal_ids"),
        ]

    def __str__(self) -> str:
        return f"{self.path} ({self.type} {self.id})"

    @property
    def is_root(self) -> bool:
        return self.parent_id is None

    @property
    def root_id(self) -> int:
        return self.traversal_ids[0] if self.traversal_ids else self.id


class Project(ClockStampedModel):
    """A GitLab project; ``project_namespace`` is its companion row in ``namespaces``."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=255)
    path = models.CharField(max_length=255)
    namespace = models.ForeignKey(Namespace, on_delete=models.CASCADE, related_name="projects")
    project_namespace = models.OneToOneField(
        Namespace, null=True, blank=True, on_delete=models.CASCADE, related_name="project"
    )
    visibility_level = models.IntegerField(db_default=0, default=0)
    archived = models.BooleanField(db_default=False, default=False)
    # The Gitaly storage shard holding the repository (GitLab's column).
    repository_storage = models.CharField(max_length=255, db_default="default", default="default")
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        db_table = "projects"

    def __str__(self) -> str:
        return f"{self.path} (project {self.id})"


class ProjectFeature(ClockStampedModel):
    """Per-project feature access levels; index payloads carry ``repository_access_level``."""

    class AccessLevel(models.IntegerChoices):
        DISABLED = 0, "disabled"
        PRIVATE = 10, "private"
        ENABLED = 20, "enabled"

    id = models.BigAutoField(primary_key=True)
    project = models.OneToOneField(
        Project, on_delete=models.CASCADE, related_name="project_feature"
    )
    repository_access_level = models.IntegerField(
        choices=AccessLevel.choices, db_default=20, default=AccessLevel.ENABLED
    )
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        db_table = "project_features"

    def __str__(self) -> str:
        return f"features of project {self.project_id}"


class ForkNetworkMember(ClockStampedModel):
    """Membership of a project in a fork network; a forked project names its source."""

    id = models.BigAutoField(primary_key=True)
    project = models.OneToOneField(
        Project, on_delete=models.CASCADE, related_name="fork_network_member"
    )
    forked_from_project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="forks"
    )

    class Meta:
        db_table = "fork_network_members"

    def __str__(self) -> str:
        return f"fork network member {self.project_id}"


class ProjectStatistics(ClockStampedModel):
    """Per-project sizes; the planner reads ``repository_size`` (the Gitaly repository size)."""

    id = models.BigAutoField(primary_key=True)
    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="statistics")
    namespace_id = models.BigIntegerField()
    repository_size = models.BigIntegerField(db_default=0, default=0)
    storage_size = models.BigIntegerField(db_default=0, default=0)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        db_table = "project_statistics"
        verbose_name_plural = "project statistics"
        indexes = [models.Index(fields=["namespace_id"], name="project_stats_namespace_id")]

    def __str__(self) -> str:
        return f"statistics of project {self.project_id}"


class NamespaceRootStorageStatistics(ClockStampedModel):
    """Storage totals of a root namespace, summed over its projects."""

    namespace = models.OneToOneField(
        Namespace,
        primary_key=True,
        on_delete=models.CASCADE,
        related_name="root_storage_statistics",
    )
    repository_size = models.BigIntegerField(db_default=0, default=0)
    storage_size = models.BigIntegerField(db_default=0, default=0)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        db_table = "namespace_root_storage_statistics"
        verbose_name_plural = "namespace root storage statistics"

    def __str__(self) -> str:
        return f"root storage statistics of namespace {self.namespace_id}"


# ----------------------------------------------------------------------------
# GitLab's six Zoekt tables
# ----------------------------------------------------------------------------


def natural_key(name: str) -> tuple:
    """The order of every list of nodes an operator reads, by name: ``zoekt-2`` before
    ``zoekt-10`` (digits compare as numbers); ties by id where a list sorts with it."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part.lower())
        for part in re.split(r"(\d+)", name)
        if part
    )


#: A zone label: 1 to 63 letters, digits, ``.``, ``_`` or ``-``, starting with a
#: letter or digit (``us-east-1a``, ``rack-3``).
ZONE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
ZONE_MAX_LENGTH = 63
ZONE_HELP = (
    "The node's failure domain (an availability zone, a rack): 1 to 63 letters, digits, "
    "'.', '_' or '-'. Empty: none. The replicas of a namespace go to distinct zones "
    "where the zones allow it."
)
_ZONE_RE = re.compile(ZONE_PATTERN)


def validate_zone(value: str | None) -> None:
    """A zone label or nothing (``ZONE_PATTERN``)."""
    if value is None:
        return
    if not isinstance(value, str) or not _ZONE_RE.fullmatch(value):
        raise ValidationError(
            "A zone is 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit.",
            code="invalid_zone",
        )


def normalize_zone(value: str | None) -> str | None:
    """A zone as stored: stripped, and empty as NULL (no zone)."""
    if value is None:
        return None
    value = value.strip()
    return value or None


class Node(ClockStampedModel):
    """One Zoekt indexer + webserver pair, identified by its UUID (``zoekt_nodes``)."""

    class Service(models.IntegerChoices):
        ZOEKT = 0, "zoekt"

    id = models.BigAutoField(primary_key=True)
    uuid = models.UUIDField(unique=True)
    used_bytes = models.BigIntegerField(db_default=0, default=0)
    total_bytes = models.BigIntegerField(db_default=0, default=0)
    indexed_bytes = models.BigIntegerField(db_default=0, default=0)
    usable_storage_bytes = models.BigIntegerField(db_default=0, default=0)
    usable_storage_bytes_locked_until = models.DateTimeField(null=True, blank=True)
    #: When the node's disk use last went to or over the high watermark and
    #: stayed there (the eviction sustain clock, docs/eviction.md): set by the
    #: heartbeat upsert on a crossing, cleared when use falls below the high
    #: watermark minus the hysteresis. Not GitLab's (its MR 264628 keeps one).
    high_watermark_exceeded_at = models.DateTimeField(null=True, blank=True)
    #: The same clock for webserver memory (RSS ÷ budget at or over the high memory
    #: watermark), kept by the memory-pressure job (``eviction.memory_pressure``).
    memory_high_watermark_exceeded_at = models.DateTimeField(null=True, blank=True)
    #: Eviction cooldown: no eviction from the node and no new placement on it
    #: before this (docs/eviction.md); cleared early once the evicted indices are gone.
    eviction_cooldown_until = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(db_default=EPOCH, default=EPOCH, db_index=True)
    # When a heartbeat last relayed the webserver's process health (NULL: never).
    webserver_last_seen_at = models.DateTimeField(null=True, blank=True)
    index_base_url = models.TextField()
    search_base_url = models.TextField()
    metadata = models.JSONField(
        db_default={}, default=_json_object_default, blank=True, validators=[validate_node_metadata]
    )
    schema_version = models.SmallIntegerField(db_default=0, default=0)
    services = ArrayField(
        models.SmallIntegerField(choices=Service.choices), db_default=[0], default=_services_default
    )
    #: The node's failure domain (an availability zone, a rack), set by the operator;
    #: NULL: none. Not GitLab's (its nodes report no zone): the replicas of a namespace
    #: go to distinct zones where the zones allow it (docs/planner.md, "Zones"). NULL, not
    #: "", is "no zone": the planner, the balance and the zone queries read NULL.
    zone = models.TextField(  # noqa: DJ001
        null=True,
        blank=True,
        validators=[validate_zone],
        help_text=ZONE_HELP,
    )
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    objects = NodeQuerySet.as_manager()

    class Meta:
        db_table = "zoekt_nodes"
        constraints = [
            models.CheckConstraint(
                condition=LessThanOrEqual(Length("index_base_url"), 1024),
                name="check_zoekt_nodes_index_base_url_length",
            ),
            models.CheckConstraint(
                condition=LessThanOrEqual(Length("search_base_url"), 1024),
                name="check_zoekt_nodes_search_base_url_length",
            ),
            models.CheckConstraint(
                condition=Q(zone__isnull=True) | Q(zone__regex=ZONE_PATTERN),
                name="check_zoekt_nodes_zone_label",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.uuid})"

    def save(self, *args, **kwargs) -> None:
        self.zone = normalize_zone(self.zone)
        self.recompute_usable_storage_bytes()
        update_fields = kwargs.get("update_fields")
        if update_fields is not None:
            kwargs["update_fields"] = {
                *update_fields,
                "usable_storage_bytes",
                "usable_storage_bytes_locked_until",
            }
        super().save(*args, **kwargs)

    # --- identity and reported values ---------------------------------------------
    @property
    def name(self) -> str:
        return str(self.metadata.get("name") or f"node-{self.id}")

    @property
    def version(self) -> str | None:
        return self.metadata.get("version")

    @property
    def process_health(self) -> dict:
        return self.metadata.get("process_health") or {}

    # --- disk -------------------------------------------------------------------------------
    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.used_bytes

    @property
    def storage_percent_used(self) -> float:
        return capacity.storage_percent_used(self.used_bytes, self.total_bytes)

    @property
    def watermark(self) -> capacity.NodeWatermark:
        return capacity.node_watermark(
            self.storage_percent_used, app_settings.development_watermarks()
        )

    def _limit_reached(self, which: int) -> bool:
        return (
            self.storage_percent_used
            >= capacity.watermark_limits(app_settings.development_watermarks())[which]
        )

    def low_watermark_exceeded(self) -> bool:
        return self._limit_reached(0)

    def high_watermark_exceeded(self) -> bool:
        return self._limit_reached(1)

    def critical_watermark_exceeded(self) -> bool:
        return self._limit_reached(2)

    @property
    def reserved_storage_bytes(self) -> int:
        """Sum of every index's reservation on this node, in every state."""
        annotated = getattr(self, "annotated_reserved_storage_bytes", None)
        if annotated is not None:
            return annotated
        return self.indices.aggregate(total=models.Sum("reserved_storage_bytes"))["total"] or 0

    @property
    def unclaimed_storage_bytes(self) -> int:
        """Usable minus reserved; negative when the node is over-committed."""
        annotated = getattr(self, "annotated_unclaimed_storage_bytes", None)
        if annotated is not None:
            return annotated
        return self.usable_storage_bytes - self.reserved_storage_bytes

    def recompute_usable_storage_bytes(self, now: datetime | None = None) -> bool:
        """Refresh ``usable_storage_bytes`` unless locked; True when it was recomputed."""
        now = now or clock.now()
        locked_until = self.usable_storage_bytes_locked_until
        if locked_until is not None and locked_until > now:
            return False
        self.usable_storage_bytes = capacity.usable_storage_bytes(
            self.total_bytes, self.used_bytes, self.indexed_bytes
        )
        self.usable_storage_bytes_locked_until = None
        return True

    # --- liveness -------------------------------------------------------------------------
    def is_online(self, now: datetime | None = None) -> bool:
        now = now or clock.now()
        return (
            now - self.last_seen_at
        ).total_seconds() < capacity.ONLINE_DURATION_THRESHOLD_SECONDS

    def is_lost(self, threshold_seconds: int | None, now: datetime | None = None) -> bool:
        """Not seen for the lost-node threshold (``<=`` as GitLab's method; None disables)."""
        if not threshold_seconds:
            return False
        now = now or clock.now()
        return (now - self.last_seen_at).total_seconds() >= threshold_seconds

    # --- tasks ---------------------------------------------------------------------------------
    def concurrency_limit(self, cpu_to_tasks_ratio: float) -> int:
        return capacity.concurrency_limit(
            self.metadata.get("concurrency"),
            self.metadata.get("concurrency_override"),
            cpu_to_tasks_ratio,
        )


class EnabledNamespace(ClockStampedModel):
    """A root namespace enabled for Zoekt (``zoekt_enabled_namespaces``)."""

    id = models.BigAutoField(primary_key=True)
    root_namespace = models.OneToOneField(
        Namespace, on_delete=models.CASCADE, related_name="zoekt_enabled_namespace"
    )
    search = models.BooleanField(db_default=True, default=True)
    metadata = models.JSONField(
        db_default={},
        default=_json_object_default,
        blank=True,
        validators=[validate_enabled_namespace_metadata],
    )
    last_rollout_failed_at = models.DateTimeField(null=True, blank=True, db_index=True)
    number_of_replicas_override = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    objects = EnabledNamespaceQuerySet.as_manager()

    class Meta:
        db_table = "zoekt_enabled_namespaces"
        constraints = [
            models.CheckConstraint(
                condition=Q(number_of_replicas_override__isnull=True)
                | Q(number_of_replicas_override__gt=0),
                name="check_zoekt_enabled_namespaces_replicas_override_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"enabled namespace {self.root_namespace_id}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if self.root_namespace_id is not None and self.root_namespace.parent_id is not None:
            raise ValidationError({"root_namespace": "must be a root namespace (it has a parent)"})

    def number_of_replicas(self, default_number_of_replicas: int) -> int:
        return self.number_of_replicas_override or default_number_of_replicas

    def update_last_used_storage_bytes(self) -> int:
        """Store the largest per-replica sum of used bytes in ``metadata``."""
        per_replica = (
            Index.objects.filter(zoekt_replica__zoekt_enabled_namespace=self)
            .values("zoekt_replica_id")
            .annotate(total=models.Sum("used_storage_bytes"))
            .values_list("total", flat=True)
        )
        value = max(per_replica, default=0)
        if value == 0 and self.metadata.get("last_used_storage_bytes"):
            # Already evicted (its indices left their replica): keep what was
            # recorded when it still had them, rather than overwrite it with 0.
            return self.metadata["last_used_storage_bytes"]
        self.metadata = {**self.metadata, "last_used_storage_bytes": value}
        self.save(update_fields=["metadata", "updated_at"])
        return value


class Replica(ClockStampedModel):
    """One full copy of a root namespace's search data (``zoekt_replicas``)."""

    class State(models.IntegerChoices):
        PENDING = 0, "pending"
        READY = 10, "ready"

    id = models.BigAutoField(primary_key=True)
    zoekt_enabled_namespace = models.ForeignKey(
        EnabledNamespace, on_delete=models.CASCADE, related_name="replicas"
    )
    namespace = models.ForeignKey(
        Namespace, on_delete=models.CASCADE, related_name="zoekt_replicas"
    )
    state = models.SmallIntegerField(
        choices=State.choices, db_default=0, default=State.PENDING, db_index=True
    )
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    objects = ReplicaQuerySet.as_manager()

    class Meta:
        db_table = "zoekt_replicas"

    def __str__(self) -> str:
        return f"replica {self.id} of namespace {self.namespace_id}"


def in_range(value: int, low: int | None, high: int | None) -> bool:
    """``low <= value <= high``, either end open when None (project-namespace id ranges)."""
    return (low is None or value >= low) and (high is None or value <= high)


class Index(ClockStampedModel):
    """The part of a replica that lives on one node (``zoekt_indices``)."""

    class State(models.IntegerChoices):
        PENDING = 0, "pending"
        IN_PROGRESS = 1, "in_progress"
        INITIALIZING = 2, "initializing"
        READY = 10, "ready"
        REALLOCATING = 20, "reallocating"
        PENDING_EVICTION = 220, "pending_eviction"
        EVICTED = 225, "evicted"
        ORPHANED = 230, "orphaned"
        PENDING_DELETION = 240, "pending_deletion"

    class WatermarkLevel(models.IntegerChoices):
        HEALTHY = 0, "healthy"
        OVERPROVISIONED = 10, "overprovisioned"
        LOW_WATERMARK_EXCEEDED = 30, "low_watermark_exceeded"
        HIGH_WATERMARK_EXCEEDED = 60, "high_watermark_exceeded"
        CRITICAL_WATERMARK_EXCEEDED = 90, "critical_watermark_exceeded"

    PRE_READY_STATES = (State.PENDING, State.IN_PROGRESS, State.INITIALIZING)
    EVICTION_STATES = (State.PENDING_EVICTION, State.EVICTED)
    SEARCHABLE_STATES = (State.READY,)
    SHOULD_BE_DELETED_STATES = (State.ORPHANED, State.PENDING_DELETION)

    id = models.BigAutoField(primary_key=True)
    zoekt_enabled_namespace = models.ForeignKey(
        EnabledNamespace,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="indices",
        db_index=False,  # led by the unique (zoekt_enabled_namespace_id, zoekt_node_id) index
    )
    zoekt_node = models.ForeignKey(
        Node,
        on_delete=models.CASCADE,
        related_name="indices",
        db_index=False,  # led by the unique (zoekt_node_id, id) index
    )
    zoekt_replica = models.ForeignKey(
        Replica, null=True, blank=True, on_delete=models.SET_NULL, related_name="indices"
    )
    namespace_id = models.BigIntegerField(db_index=True)
    state = models.SmallIntegerField(choices=State.choices, db_default=0, default=State.PENDING)
    reserved_storage_bytes = models.BigIntegerField(
        null=True,
        blank=True,
        db_default=capacity.DEFAULT_RESERVED_STORAGE_BYTES,
        default=capacity.DEFAULT_RESERVED_STORAGE_BYTES,
    )
    used_storage_bytes = models.BigIntegerField(db_default=0, default=0)
    used_storage_bytes_updated_at = models.DateTimeField(db_default=EPOCH, default=EPOCH)
    last_indexed_at = models.DateTimeField(db_default=EPOCH, default=EPOCH)
    watermark_level = models.SmallIntegerField(
        choices=WatermarkLevel.choices, db_default=0, default=WatermarkLevel.HEALTHY
    )
    metadata = models.JSONField(
        db_default={},
        default=_json_object_default,
        blank=True,
        validators=[validate_index_metadata],
    )
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    objects = IndexQuerySet.as_manager()

    class Meta:
        db_table = "zoekt_indices"
        verbose_name_plural = "indices"
        constraints = [
            models.UniqueConstraint(
                fields=["zoekt_enabled_namespace", "zoekt_node"],
                name="index_zoekt_indices_on_enabled_namespace_id_and_node_id",
            ),
            models.UniqueConstraint(
                fields=["state", "id"], name="index_zoekt_indices_on_state_and_id"
            ),
            models.UniqueConstraint(
                fields=["zoekt_node", "id"], name="index_zoekt_indices_on_zoekt_node_id_and_id"
            ),
        ]
        indexes = [
            models.Index(
                fields=["used_storage_bytes_updated_at"], name="zoekt_idx_used_bytes_upd_at"
            ),
            models.Index(fields=["watermark_level", "state"], name="zoekt_idx_watermark_state"),
        ]

    def __str__(self) -> str:
        return f"index {self.id} of namespace {self.namespace_id} on node {self.zoekt_node_id}"

    @property
    def free_storage_bytes(self) -> int:
        return (self.reserved_storage_bytes or 0) - self.used_storage_bytes

    def holds_project_namespace(self, project_namespace_id: int | None) -> bool:
        """Whether the id lies in the index's range (an open end is unbounded; an index
        without a range holds every project, and an unknown id only such an index)."""
        bounds = self.project_namespace_id_range
        if bounds is None:
            return True
        return project_namespace_id is not None and in_range(project_namespace_id, *bounds)

    @property
    def project_namespace_id_range(self) -> tuple[int | None, int | None] | None:
        """The inclusive range of project-namespace ids; None means the whole namespace."""
        start = self.metadata.get("project_namespace_id_from")
        end = self.metadata.get("project_namespace_id_to")
        if start is None and end is None:
            return None
        return (start, end)

    def computed_watermark_level(self) -> int:
        return int(
            capacity.index_watermark_level(self.used_storage_bytes, self.reserved_storage_bytes)
        )

    def update_storage_bytes_and_watermark_level(
        self, *, skip_used_storage_bytes: bool = False
    ) -> None:
        """Refresh used bytes, resize the reservation and store the level (reference 4.3).

        ``refresh_storage_of`` with this one index; its fields are read back.
        """
        if not Index.refresh_storage_of(
            self.zoekt_node_id, [self.pk], skip_used_storage_bytes=skip_used_storage_bytes
        ):
            raise Index.DoesNotExist(f"index {self.pk} is gone")
        fresh = Index.objects.get(pk=self.pk)
        for field in (
            "used_storage_bytes",
            "used_storage_bytes_updated_at",
            "reserved_storage_bytes",
            "watermark_level",
            "updated_at",
        ):
            setattr(self, field, getattr(fresh, field))

    @staticmethod
    def refresh_storage_of(
        node_id: int, index_ids: list[int], *, skip_used_storage_bytes: bool = False
    ) -> int:
        """Refresh the used bytes, reservation and level of some indices of one node, in one
        transaction (reference 4.3); returns how many were refreshed (gone ones are not).

        The node row is locked, so two refreshes never claim the same unclaimed bytes.
        Counting takes each index's used-bytes lock first (``zoekt.locks``, in id order), so a
        callback committing meanwhile is either in the sum or marks the index stale again
        after it (``actions._mark_index_stale``). The indices are resized one after the other
        in id order, each against what the node has left unclaimed after the ones before it,
        as a refresh of each alone would; the used bytes of all of them are summed in one
        query and written in one update.
        """
        from django.db import transaction

        from zoekt import locks

        index_ids = sorted(set(index_ids))
        with transaction.atomic():
            node = Node.objects.select_for_update().filter(pk=node_id).first()
            if node is None or not index_ids:
                return 0
            if not skip_used_storage_bytes:
                for index_id in index_ids:
                    locks.index_used_bytes_lock(index_id, shared=False)
            indices = list(
                Index.objects.select_for_update()
                .filter(pk__in=index_ids, zoekt_node_id=node_id)
                .order_by("id")
            )
            if not indices:
                return 0
            now = clock.now()
            if not skip_used_storage_bytes:
                used = dict(
                    Repository.objects.filter(zoekt_index_id__in=[i.pk for i in indices])
                    .order_by()
                    .values("zoekt_index_id")
                    .annotate(total=models.Sum("size_bytes"))
                    .values_list("zoekt_index_id", "total")
                )
            unclaimed = (
                Node.objects.with_unclaimed_storage_bytes()
                .get(pk=node.pk)
                .annotated_unclaimed_storage_bytes
            )
            for index in indices:
                if not skip_used_storage_bytes:
                    index.used_storage_bytes = (
                        used.get(index.pk) or capacity.DEFAULT_USED_STORAGE_BYTES
                    )
                    index.used_storage_bytes_updated_at = now
                before = index.reserved_storage_bytes or 0
                index.reserved_storage_bytes = capacity.resized_reservation(
                    index.used_storage_bytes,
                    index.reserved_storage_bytes,
                    unclaimed,
                    index_is_ready=index.state == Index.State.READY,
                )
                unclaimed -= index.reserved_storage_bytes - before
                index.watermark_level = index.computed_watermark_level()
                index.updated_at = now
            Index.objects.bulk_update(
                indices,
                [
                    "used_storage_bytes",
                    "used_storage_bytes_updated_at",
                    "reserved_storage_bytes",
                    "watermark_level",
                    "updated_at",
                ],
            )
        return len(indices)


class Repository(ClockStampedModel):
    """One project indexed (or to be indexed) inside one index (``zoekt_repositories``)."""

    class State(models.IntegerChoices):
        PENDING = 0, "pending"
        INITIALIZING = 1, "initializing"
        READY = 10, "ready"
        ORPHANED = 230, "orphaned"
        PENDING_DELETION = 240, "pending_deletion"
        DELETED = 250, "deleted"
        FAILED = 255, "failed"

    INDEXABLE_STATES = (State.PENDING, State.INITIALIZING, State.READY)
    SEARCHABLE_STATES = (State.READY,)
    # GitLab's database default is 10; its model default is 3.
    DB_DEFAULT_RETRIES_LEFT = 10
    MODEL_DEFAULT_RETRIES_LEFT = 3

    id = models.BigAutoField(primary_key=True)
    zoekt_index = models.ForeignKey(
        Index, on_delete=models.RESTRICT, related_name="repositories", db_index=False
    )  # led by the unique (zoekt_index_id, project_id)
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="zoekt_repositories"
    )
    project_identifier = models.BigIntegerField()
    state = models.SmallIntegerField(
        choices=State.choices, db_default=0, default=State.PENDING, db_index=True
    )
    indexed_at = models.DateTimeField(null=True, blank=True)
    size_bytes = models.BigIntegerField(db_default=0, default=0)
    index_file_count = models.IntegerField(db_default=0, default=0)
    retries_left = models.SmallIntegerField(
        db_default=DB_DEFAULT_RETRIES_LEFT, default=MODEL_DEFAULT_RETRIES_LEFT
    )
    schema_version = models.SmallIntegerField(db_default=0, default=0)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    objects = RepositoryQuerySet.as_manager()

    class Meta:
        db_table = "zoekt_repositories"
        verbose_name_plural = "repositories"
        constraints = [
            models.UniqueConstraint(
                fields=["zoekt_index", "project"],
                name="index_zoekt_repositories_on_zoekt_index_id_and_project_id",
            ),
            models.UniqueConstraint(
                fields=["zoekt_index", "project_identifier"],
                name="index_zoekt_repositories_on_index_id_and_identifier",
            ),
            models.CheckConstraint(
                condition=Q(project__isnull=True) | Q(project=models.F("project_identifier")),
                name="check_zoekt_repositories_project_id_matches_identifier",
            ),
            models.CheckConstraint(
                condition=GreaterThan(models.F("retries_left"), 0)
                | Q(retries_left=0, state__gte=200),
                name="check_zoekt_repositories_retries_left",
            ),
        ]

    def __str__(self) -> str:
        return f"repository of project {self.project_identifier} in index {self.zoekt_index_id}"


class Task(ClockStampedModel):
    """A unit of work for one node, pulled on its heartbeat (``zoekt_tasks``).

    The table is partitioned by LIST on ``partition_id`` with the primary key
    (id, partition_id), as in GitLab; ``id`` comes from a sequence and is
    unique on its own, which is what Django treats as the key. Migration 0001
    creates the table with raw SQL for that reason.
    """

    class TaskType(models.IntegerChoices):
        INDEX_REPO = 0, "index_repo"
        FORCE_INDEX_REPO = 1, "force_index_repo"
        DELETE_REPO = 50, "delete_repo"

    class State(models.IntegerChoices):
        PENDING = 0, "pending"
        PROCESSING = 1, "processing"
        DONE = 10, "done"
        SKIPPED = 250, "skipped"
        FAILED = 255, "failed"
        ORPHANED = 256, "orphaned"

    PROCESSING_BATCH_SIZE = 100
    RETRY_DELAY_SECONDS = 5 * 60
    PARTITION_DURATION_SECONDS = 24 * 3600
    PARTITION_CLEANUP_THRESHOLD_SECONDS = 7 * 24 * 3600
    # GitLab's database default is 5; its model default is 3.
    DB_DEFAULT_RETRIES_LEFT = 5
    MODEL_DEFAULT_RETRIES_LEFT = 3

    id = models.BigAutoField(primary_key=True)
    partition_id = models.BigIntegerField(db_default=1, default=1)
    zoekt_node_id = models.BigIntegerField()
    zoekt_repository_id = models.BigIntegerField()
    project_identifier = models.BigIntegerField()
    task_type = models.SmallIntegerField(choices=TaskType.choices)
    state = models.SmallIntegerField(choices=State.choices, db_default=0, default=State.PENDING)
    perform_at = models.DateTimeField(db_default=Now())
    retries_left = models.SmallIntegerField(
        db_default=DB_DEFAULT_RETRIES_LEFT, default=MODEL_DEFAULT_RETRIES_LEFT
    )
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)
    # The task's place in its node's admission queue (docs/scheduling.md), set when it is
    # queued (``task_creation.queue_for_admission``). Not GitLab's columns: GitLab hands
    # out the oldest tasks first and needs none. ``priority`` is a
    # ``zoekt.admission.Priority``; ``namespace_id`` the root namespace of its index (0:
    # none); ``index_bytes`` its repository's index bytes when queued (the size of its
    # temporary data); ``turn`` its round within the node's queue of that priority.
    priority = models.SmallIntegerField(db_default=3, default=3)
    namespace_id = models.BigIntegerField(db_default=0, default=0)
    index_bytes = models.BigIntegerField(db_default=0, default=0)
    turn = models.BigIntegerField(db_default=0, default=0)

    objects = TaskQuerySet.as_manager()

    class Meta:
        db_table = "zoekt_tasks"
        indexes = [
            models.Index(fields=["state"], name="zoekt_tasks_state"),
            models.Index(
                fields=["zoekt_node_id", "state", "perform_at"],
                name="zoekt_tasks_node_state_perform",
            ),
            models.Index(fields=["zoekt_repository_id"], name="zoekt_tasks_repository_id"),
            # The head of a node's admission queue: a hand-out reads it in order.
            models.Index(
                fields=["zoekt_node_id", "priority", "turn", "perform_at", "id"],
                condition=Q(state=0),
                name="zoekt_tasks_queue_head",
            ),
            # A namespace's last turn in a node's queue, read when its next tasks are queued.
            models.Index(
                fields=["zoekt_node_id", "priority", "namespace_id", "turn"],
                condition=Q(state=0),
                name="zoekt_tasks_queue_namespace",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=GreaterThan(models.F("retries_left"), 0) | Q(retries_left=0, state=255),
                name="check_zoekt_tasks_retries_left",
            ),
            # At most one pending task of a type per repository, whatever the interleaving
            # (the partition key is part of it, as every unique index of a partitioned
            # table must be; there is one partition).
            models.UniqueConstraint(
                fields=["zoekt_repository_id", "task_type", "partition_id"],
                condition=Q(state=0),
                name="zoekt_tasks_one_pending_per_repository",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_task_type_display()} task {self.id} for node {self.zoekt_node_id}"


class HandledTaskFailure(models.Model):
    """A task that failed for good and whose repository retry was spent (not GitLab's).

    The row is written in the transaction that spends the retry, and its key is
    the task id, so the database refuses a second: a redelivered or swept
    ``handle_task_failed`` spends one retry per failed task whatever the
    interleaving or crash. Kept as long as tasks are (reference 1.6).
    """

    task_id = models.BigIntegerField(primary_key=True)
    handled_at = models.DateTimeField(default=clock.now)

    class Meta:
        db_table = "zoekt_handled_task_failures"

    def __str__(self) -> str:
        return f"failed task {self.task_id} handled at {self.handled_at}"


class IllegalTransition(Exception):
    """A state change its machine's transition table does not allow; nothing was written."""

    def __init__(self, machine: str, row_id, from_state, to_state) -> None:
        self.machine = machine
        self.row_id = row_id
        self.from_state = from_state
        self.to_state = to_state
        super().__init__(f"{machine} {row_id}: {from_state} → {to_state} is not a legal transition")


class Move(ClockStampedModel):
    """A move of one index off a node: its replacement is built elsewhere while it serves.

    Not a GitLab table (``zoekt_moves``). It lives with the domain because it
    is the lease every reconciler respects: while a move is live, the rollout
    leaves its namespace alone (the replacement replica would look like a
    surplus to destroy), and nothing else deletes its source or its
    replacement. The machinery that plans, builds and swaps moves is the
    eviction package's (``eviction.moves``); docs/eviction.md has the states.

    The replacement index covers the source's project range on a node that
    holds no index of the namespace, in a build replica of its own; the swap
    puts it in the source's place in the serving replica and evicts the source
    index alone, once the replacement is ready on a searchable node.
    """

    class State(models.TextChoices):
        PLANNED = "planned"
        BUILDING = "building"
        READY_TO_SWAP = "ready_to_swap"
        SWAPPING = "swapping"
        DONE = "done"
        FALLEN_BACK = "fallen_back"
        PARKED = "parked"
        CANCELLED = "cancelled"

    #: States in which the move holds its lease.
    LIVE = (State.PLANNED, State.BUILDING, State.READY_TO_SWAP, State.SWAPPING)
    #: The states a move is created in: planned, or (critical watermark, no node with
    #: room) fallen back at once, its replica deleted first.
    BIRTH_STATES = (State.PLANNED, State.FALLEN_BACK)
    #: The one transition table (``transition``): from each state, the states it may go to.
    #: Planned → planned rewrites why it waits (throttled, retrying); swapping → swapping
    #: is a swap tried again; done → done records the re-split's next carve.
    TRANSITIONS: dict[str, frozenset[str]] = {
        State.PLANNED: frozenset({State.PLANNED, State.BUILDING, State.PARKED, State.CANCELLED}),
        State.BUILDING: frozenset({State.PLANNED, State.READY_TO_SWAP, State.PARKED}),
        State.READY_TO_SWAP: frozenset({State.BUILDING, State.SWAPPING}),
        State.SWAPPING: frozenset({State.BUILDING, State.SWAPPING, State.DONE}),
        State.DONE: frozenset({State.DONE}),
        State.FALLEN_BACK: frozenset(),
        State.PARKED: frozenset(),
        State.CANCELLED: frozenset(),
    }
    #: The column each state stamps, the first time a move enters it (planned stamps
    #: ``created_at`` at creation; fallen back stamps at creation, see ``fall_back``).
    STAMPS: dict[str, str] = {
        State.BUILDING: "building_at",
        State.READY_TO_SWAP: "ready_to_swap_at",
        State.SWAPPING: "swapping_at",
        State.DONE: "done_at",
        State.FALLEN_BACK: "fallen_back_at",
        State.PARKED: "parked_at",
        State.CANCELLED: "cancelled_at",
    }
    IllegalTransition = IllegalTransition
    #: How long a move may take: a floor plus a time per byte (TiDB PD's rule of a
    #: deadline that grows with the size, at 1 MiB/s of progress), see docs/eviction.md.
    DEADLINE_FLOOR_SECONDS = 3600
    DEADLINE_SECONDS_PER_BYTE = 1 / (1024 * 1024)

    id = models.BigAutoField(primary_key=True)
    trigger = models.CharField(max_length=32)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PLANNED)
    #: Why it fell back, was parked or cancelled (a ``zoekt.reasons`` code).
    reason = models.CharField(max_length=64, blank=True, default="")
    #: The eviction decision that asked for it (``zoekt_eviction_decisions.id``).
    decision_id = models.BigIntegerField(null=True, blank=True)
    zoekt_enabled_namespace = models.ForeignKey(
        EnabledNamespace, on_delete=models.CASCADE, related_name="moves"
    )
    namespace_id = models.BigIntegerField()
    source_node = models.ForeignKey(
        Node, null=True, on_delete=models.SET_NULL, related_name="moves_out"
    )
    source_index = models.ForeignKey(
        "Index", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    source_replica = models.ForeignKey(
        Replica, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    #: The ids as they were, kept when the rows are gone after the swap.
    source_index_ref = models.BigIntegerField()
    source_replica_ref = models.BigIntegerField(null=True, blank=True)
    project_namespace_id_from = models.BigIntegerField(null=True, blank=True)
    project_namespace_id_to = models.BigIntegerField(null=True, blank=True)
    target_node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="moves_in"
    )
    replacement_replica = models.ForeignKey(
        Replica, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    replacement_index = models.ForeignKey(
        "Index", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    #: The source index's used bytes when the move was planned.
    bytes = models.BigIntegerField(default=0)
    deadline_at = models.DateTimeField(null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)
    building_at = models.DateTimeField(null=True, blank=True)
    ready_to_swap_at = models.DateTimeField(null=True, blank=True)
    swapping_at = models.DateTimeField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)
    fallen_back_at = models.DateTimeField(null=True, blank=True)
    parked_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    objects = MoveQuerySet.as_manager()

    class Meta:
        db_table = "zoekt_moves"
        indexes = [models.Index(fields=["state"], name="zoekt_moves_state")]
        constraints = [
            # At most one live move per source index, and per namespace (one-index
            # namespaces): the database refuses a second, whatever the interleaving.
            models.UniqueConstraint(
                fields=["source_index_ref"],
                condition=Q(state__in=["planned", "building", "ready_to_swap", "swapping"]),
                name="zoekt_moves_one_live_per_source_index",
            ),
            models.UniqueConstraint(
                fields=["zoekt_enabled_namespace"],
                condition=Q(state__in=["planned", "building", "ready_to_swap", "swapping"]),
                name="zoekt_moves_one_live_per_namespace",
            ),
        ]

    def __str__(self) -> str:
        return f"move {self.id} of index {self.source_index_ref} ({self.state})"

    @property
    def live(self) -> bool:
        return self.state in self.LIVE

    def transition(self, state: str, now: datetime, **fields) -> str:
        """Move to ``state`` if the table allows it (else ``IllegalTransition``, nothing
        written): write the state, its time the first time it is entered, ``updated_at``
        and ``fields``, and only those columns, so the foreign keys a delete just nulled
        in the database stay nulled. Returns the new state."""
        if state not in self.TRANSITIONS.get(self.state, frozenset()):
            raise IllegalTransition("move", self.pk, self.state, state)
        stamp = self.STAMPS.get(state)
        self.state = state
        self.updated_at = now
        changed = {"state", "updated_at", *fields}
        if stamp and getattr(self, stamp) is None:
            setattr(self, stamp, now)
            changed.add(stamp)
        for key, value in fields.items():
            setattr(self, key, value)
        self.save(update_fields=sorted(changed))
        return state

    @classmethod
    def fall_back(cls, now: datetime, **fields) -> Move:
        """A move created fallen back (the index is deleted first), stamped ``now``."""
        return cls.objects.create(**fields, state=cls.State.FALLEN_BACK, fallen_back_at=now)

    @classmethod
    def deadline_seconds(cls, size_bytes: int) -> int:
        return int(cls.DEADLINE_FLOOR_SECONDS + max(size_bytes, 0) * cls.DEADLINE_SECONDS_PER_BYTE)

    @staticmethod
    def fields_from_source(index: Index, trigger: str, now) -> dict:
        """A move record's fields that describe the index leaving its node."""
        return {
            "trigger": trigger,
            "zoekt_enabled_namespace_id": index.zoekt_enabled_namespace_id,
            "namespace_id": index.namespace_id,
            "source_node_id": index.zoekt_node_id,
            "source_index": index,
            "source_replica_id": index.zoekt_replica_id,
            "source_index_ref": index.id,
            "source_replica_ref": index.zoekt_replica_id,
            "bytes": index.used_storage_bytes,
            "created_at": now,
            "updated_at": now,
        }


class NodeShutdown(ClockStampedModel):
    """An operator's request to take a node out of service (``zoekt_node_shutdowns``).

    Not a GitLab table: Elasticsearch's node-shutdown record (``PUT
    _nodes/<id>/shutdown``). One live record (in progress or stalled) per node,
    which the database enforces; records stay after they complete or are
    cancelled, as the node's maintenance history. A restart keeps the node's
    indices through its allowed delay (docs/operations.md); ``zoekt.shutdowns``
    decides when it completes. A remove or a replace drains the node: every
    index is moved off (``eviction.drain``), and the record completes when the
    node holds none; the node then stays out of placement until an operator
    returns it to service (``returned_to_service_at``) or deletes its row. The
    status changes only through ``transition`` and its table (``TRANSITIONS``).
    """

    class Type(models.TextChoices):
        RESTART = "restart"
        REMOVE = "remove"
        REPLACE = "replace"

    class Status(models.TextChoices):
        IN_PROGRESS = "in_progress"
        STALLED = "stalled"
        COMPLETE = "complete"
        CANCELLED = "cancelled"

    #: The statuses in which the record is live (one per node at most).
    LIVE = (Status.IN_PROGRESS, Status.STALLED)
    #: The types that move every index off the node (a drain).
    DRAINS = (Type.REMOVE, Type.REPLACE)
    #: The one transition table (``transition``): from each status, the statuses it may go to.
    TRANSITIONS: dict[str, frozenset[str]] = {
        Status.IN_PROGRESS: frozenset({Status.STALLED, Status.COMPLETE, Status.CANCELLED}),
        Status.STALLED: frozenset({Status.IN_PROGRESS, Status.COMPLETE, Status.CANCELLED}),
        Status.COMPLETE: frozenset(),
        Status.CANCELLED: frozenset(),
    }
    #: The column each status stamps when the record enters it.
    STAMPS: dict[str, str] = {
        Status.COMPLETE: "completed_at",
        Status.CANCELLED: "cancelled_at",
    }
    IllegalTransition = IllegalTransition

    id = models.BigAutoField(primary_key=True)
    #: The node; NULL once its row is deleted (handled as lost), when the record stays as
    #: history with ``node_ref`` and ``node_name``.
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="shutdowns"
    )
    node_ref = models.BigIntegerField()
    node_name = models.TextField(blank=True, default="")
    type = models.CharField(max_length=16, choices=Type.choices)
    reason = models.TextField()
    requested_by = models.CharField(max_length=150)
    requested_at = models.DateTimeField(default=clock.now)
    #: A restart's allowed delay, and its end (``requested_at`` plus the delay).
    allowed_delay_seconds = models.IntegerField(null=True, blank=True)
    delay_expires_at = models.DateTimeField(null=True, blank=True)
    #: A replace's receiving node.
    target_node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.IN_PROGRESS)
    #: Why it is stalled, or how it completed (a ``zoekt.reasons`` code).
    status_reason = models.CharField(max_length=64, blank=True, default="")
    #: A restart: the node's last heartbeat before it was seen away (offline), while
    #: the record was live; and its first heartbeat after that.
    node_left_at = models.DateTimeField(null=True, blank=True)
    node_returned_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.CharField(max_length=150, blank=True, default="")
    #: A complete drain (remove or replace) keeps its node out of placement until an
    #: operator returns the node to service: when, and who (not a status change).
    returned_to_service_at = models.DateTimeField(null=True, blank=True)
    returned_to_service_by = models.CharField(max_length=150, blank=True, default="")
    #: What the completion saw (bytes reported and expected, handled as lost); a drain's
    #: indices with nowhere to go, replicas retired, moves wound down at a cancel.
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    objects = NodeShutdownQuerySet.as_manager()

    class Meta:
        db_table = "zoekt_node_shutdowns"
        indexes = [models.Index(fields=["status"], name="zoekt_node_shutdowns_status")]
        constraints = [
            # One live record per node: the database refuses a second, whatever the
            # interleaving of two requests.
            models.UniqueConstraint(
                fields=["node"],
                condition=Q(status__in=["in_progress", "stalled"]),
                name="zoekt_node_shutdowns_one_live_per_node",
            ),
            models.CheckConstraint(
                condition=Q(allowed_delay_seconds__isnull=True) | Q(allowed_delay_seconds__gt=0),
                name="check_zoekt_node_shutdowns_allowed_delay_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} of {self.node_name or self.node_ref} ({self.status})"

    @property
    def live(self) -> bool:
        return self.status in self.LIVE

    def delay_seconds_left(self, now: datetime) -> int | None:
        """Whole seconds left of a live restart's allowed delay (0 once it passed)."""
        if self.delay_expires_at is None or not self.live:
            return None
        return max(int((self.delay_expires_at - now).total_seconds()), 0)

    @property
    def drain(self) -> bool:
        """A remove or a replace: every index is moved off the node."""
        return self.type in self.DRAINS

    @property
    def holds_node_out(self) -> bool:
        """A complete drain whose node no operator has returned to service yet."""
        return (
            self.drain
            and self.status == self.Status.COMPLETE
            and self.node_id is not None
            and self.returned_to_service_at is None
        )

    def within_delay(self, now: datetime) -> bool:
        """A live restart whose allowed delay has not passed: the node is left alone."""
        return (
            self.live
            and self.type == self.Type.RESTART
            and self.delay_expires_at is not None
            and now < self.delay_expires_at
        )

    def transition(self, status: str, now: datetime, **fields) -> str:
        """Move to ``status`` if the table allows it (else ``IllegalTransition``, nothing
        written): write it, its time the first time it is entered, ``updated_at`` and
        ``fields``, and only those columns. Returns the new status."""
        if status not in self.TRANSITIONS.get(self.status, frozenset()):
            raise IllegalTransition("node shutdown", self.pk, self.status, status)
        stamp = self.STAMPS.get(status)
        self.status = status
        self.updated_at = now
        changed = {"status", "updated_at", *fields}
        if stamp and getattr(self, stamp) is None:
            setattr(self, stamp, now)
            changed.add(stamp)
        for key, value in fields.items():
            setattr(self, key, value)
        self.save(update_fields=sorted(changed))
        return status


# ----------------------------------------------------------------------------
# Application settings: one row
# ----------------------------------------------------------------------------


class ApplicationSetting(ClockStampedModel):
    """GitLab's Zoekt application settings, one typed column per key (a single row, id 1).

    GitLab keeps these keys in one JSONB column; here each is a column of the
    same name so the admin form validates every value on its own. Read them
    through ``zoekt.app_settings.current()``, never from this model directly.
    """

    id = models.SmallIntegerField(primary_key=True, default=1, editable=False)
    zoekt_indexing_enabled = models.BooleanField("Enable indexing", default=False)
    zoekt_search_enabled = models.BooleanField("Enable searching", default=False)
    zoekt_indexing_paused = models.BooleanField(
        "Pause indexing",
        default=False,
        help_text="Stops the scheduler, rollout, event jobs and task hand-out; "
        "heartbeats answer stop_indexing.",
    )
    zoekt_auto_index_root_namespace = models.BooleanField(
        "Index root namespaces automatically", default=False
    )
    zoekt_cache_response = models.BooleanField(
        "Cache search results for five minutes", default=True
    )
    zoekt_max_restarts_15m = models.IntegerField(
        "Maximum process restarts in 15 minutes before a node leaves search",
        default=1,
        validators=[MinValueValidator(0)],
        help_text="A node whose indexer or webserver reports more restarts in the last 15 "
        "minutes than this is left out of search (once every online node runs Zoekt 1.16.0 or "
        "later). 0 is strict: any restart excludes the node.",
    )
    zoekt_cpu_to_tasks_ratio = models.FloatField("Indexing CPU to tasks multiplier", default=1.0)
    zoekt_force_reindexing_percentage = models.FloatField(
        "Probability (in %) that an index task becomes a force-reindex", default=0.25
    )
    zoekt_indexing_parallelism = models.IntegerField(
        "Number of parallel processes per indexing task", default=1
    )
    zoekt_rollout_batch_size = models.IntegerField(
        "Number of namespaces per indexing rollout", default=32
    )
    zoekt_lost_node_threshold = models.CharField(
        "Offline nodes automatically deleted after",
        max_length=32,
        default="12h",
        blank=True,
        help_text="A duration such as 30m, 12h or 2d; 0 disables lost-node handling.",
    )
    zoekt_indexing_timeout = models.CharField(
        "Indexing timeout per project",
        max_length=32,
        default="30m",
        help_text="A duration such as 30m, 1h or 1d.",
    )
    zoekt_maximum_files = models.IntegerField(
        "Maximum number of files per project to be indexed", default=500_000
    )
    zoekt_indexed_file_size_limit = models.CharField(
        "Maximum file size for indexing",
        max_length=32,
        default="1MB",
        help_text="A size such as 512KB, 1MB or 2GB (binary units).",
    )
    zoekt_trigram_max = models.IntegerField("Maximum number of trigrams per file", default=20_000)
    zoekt_rollout_retry_interval = models.CharField(
        "Retry interval for failed namespaces",
        max_length=32,
        default="1d",
        blank=True,
        help_text="A duration such as 30m, 12h or 1d; 0 means never retry.",
    )
    zoekt_default_number_of_replicas = models.IntegerField(
        "Number of replicas per namespace", default=1
    )
    zoekt_initial_indexing_limit = models.IntegerField(
        "Pending indices each node starts per scheduling run",
        default=1,
        validators=[MinValueValidator(1)],
        help_text="Every scheduling run (once a minute), each online node starts initial indexing "
        "of this many of its oldest pending indices. GitLab's default, 1, is what GitLab.com "
        "runs; a larger value fills a new or emptied node faster. At least 1.",
    )
    zoekt_node_level_eviction_enabled = models.BooleanField(
        "Evict namespaces from nodes above the high disk watermark (legacy)",
        default=False,
        help_text="GitLab's SaaS-only node-level eviction, run here on every deployment: "
        "every 5 minutes, nodes over the high disk watermark lose replicas until they are "
        "under the low watermark (with the safeguards below unless they are off).",
    )
    zoekt_node_eviction_safeguards = models.BooleanField(
        "Eviction safeguards",
        default=True,
        help_text="Sustain period, critical watermark, cooldown, sizing from the indices' used "
        "bytes on the node, and only the replicas on that node (docs/eviction.md). Off gives "
        "GitLab's legacy eviction, kept for comparison.",
    )
    zoekt_eviction_sustain_period = models.CharField(
        "Evict only after the node stayed over the high watermark for",
        max_length=32,
        default="8h",
        help_text="A duration such as 30m, 8h or 1d. Over the critical watermark a node is "
        "evicted from at once.",
    )
    zoekt_eviction_cooldown = models.CharField(
        "Longest cooldown after an eviction",
        max_length=32,
        default="12h",
        help_text="After evicting from a node, no further eviction from it and no new placement "
        "on it until the evicted indices are gone, or for at most this long.",
    )
    zoekt_eviction_order = models.CharField(
        "Which indices to evict first",
        max_length=32,
        default="smallest_used_first",
        choices=[
            ("smallest_used_first", "Smallest used bytes first"),
            ("largest_that_fits", "Largest that fits on another node"),
        ],
        help_text="Smallest first frees the node with the smallest namespaces; largest that fits "
        "affects far fewer namespaces.",
    )
    zoekt_eviction_moves = models.BooleanField(
        "Move instead of delete",
        default=True,
        help_text="With the safeguards, node-level eviction builds each chosen one-index "
        "namespace's replacement on another node and retires the copy on the full node only "
        "once the replacement serves. Delete-first only at the critical watermark with no node "
        "that has room, recorded as a fallback.",
    )
    zoekt_move_max_per_source = models.IntegerField(
        "Moves building at once off one node",
        default=2,
        validators=[MinValueValidator(1)],
        help_text="More chosen indices wait as planned moves and start as these finish "
        "(Elasticsearch's default of 2 outgoing recoveries per node).",
    )
    zoekt_move_max_per_target = models.IntegerField(
        "Moves building at once onto one node",
        default=2,
        validators=[MinValueValidator(1)],
        help_text="Replacements a node builds at once (Elasticsearch's default of 2 incoming "
        "recoveries per node): its indexing capacity keeps serving its own work.",
    )
    zoekt_memory_pressure_moves = models.BooleanField(
        "Move the hot namespace off a node under memory pressure",
        default=False,
        help_text="With moves and memory planning on: a node whose webserver stays over its "
        "high memory watermark for the sustain period moves its hottest namespace that another "
        "node can take whole.",
    )
    zoekt_move_max_in_cluster = models.IntegerField(
        "Moves building at once in the fleet",
        default=10,
        validators=[MinValueValidator(1)],
        help_text="The fleet's budget for moves; moves off a node at the critical watermark "
        "do not count against it.",
    )
    # The rebalance reconciler (docs/balance.md). Not GitLab settings: GitLab never moves
    # a placed namespace.
    zoekt_rebalance_enabled = models.BooleanField(
        "Rebalance the fleet towards its desired balance",
        default=True,
        help_text="Every 5 minutes and when a node joins, start moves towards the desired "
        "balance (each built while the index serves, then swapped), at most the maximum below "
        "at once, no index moved twice in 24 hours. It stands aside while a node is over a high "
        "watermark or shutting down, or eviction or a drain is moving. A balanced fleet has "
        "nothing to move.",
    )
    zoekt_rebalance_margin = models.FloatField(
        "Rebalance margin",
        default=0.05,
        help_text="A move must leave its target this share below its source's dominant share "
        "(0.05: 5 %), so a fleet whose nodes are all within it of the busiest has nothing to "
        "do. At least 0 and below 1.",
    )
    zoekt_rebalance_max_moves = models.IntegerField(
        "Rebalance moves at once",
        default=2,
        validators=[MinValueValidator(1)],
        help_text="Rebalance moves planned or building at once, in the fleet: below the move "
        "throttles eviction and drains use, so rebalancing never takes their room.",
    )
    # Memory-aware planning (docs/memory.md). Not GitLab settings: the memory issue's.
    zoekt_memory_ratio = models.FloatField(
        "Estimated resident memory per byte of repository",
        default=0.5,
        help_text="memory_ratio: a project's estimated webserver memory is its repository size "
        "times this (not times the buffer factor). A conservative default (0.5); see "
        "docs/memory.md. Must be greater than 0.",
    )
    zoekt_node_memory_budget_bytes = models.BigIntegerField(
        "Memory budget per node (bytes)",
        null=True,
        blank=True,
        help_text="Leave blank to plan by disk alone (the default). When set, every node is "
        "planned against this much webserver memory, or against the memory limit it reports "
        "itself (Zoekt 1.16.0 or later). Bytes, e.g. 34359738368 for 32 GiB.",
    )
    zoekt_memory_auto_calibration = models.BooleanField(
        "Calibrate the memory ratio automatically",
        default=False,
        help_text="Every hour, set the memory ratio from the 90th percentile of the observed "
        "webserver RSS per repository byte of the online nodes, within 0.1 and 2.0. Does "
        "nothing while no node reports its webserver RSS.",
    )
    zoekt_placement_strategy = models.CharField(
        "Placement strategy",
        max_length=16,
        default="balanced",
        choices=[
            ("balanced", "Balanced: the candidate with the most room now"),
            ("first_fit", "First fit: GitLab's, the first candidate with room"),
        ],
        help_text="How the rollout chooses among the nodes that can take a new index. "
        "Balanced (the product's default) spreads the fleet; first fit is GitLab's choice, "
        "which piles a small fleet onto one node.",
    )
    # Admission control of indexing work (docs/scheduling.md). Not GitLab settings.
    zoekt_indexing_admission = models.CharField(
        "Indexing admission",
        max_length=16,
        default="admission",
        choices=[
            ("admission", "Admission control: by slots, disk headroom, priority, fairly"),
            ("gitlab", "GitLab's: oldest tasks first, one pending index per node a minute"),
        ],
        help_text="How indexing work is handed to the nodes. Admission control (the product's "
        "default) fills each node's free task slots in priority order, round robin between "
        "namespaces, while the temporary space of its builds keeps it under its build ceiling "
        "(the high watermark less the eviction hysteresis band), and starts pending indices "
        "as fast as the nodes' queues drain. GitLab's hands out the oldest tasks and starts "
        "the initial indexing limit of pending indices per node a minute.",
    )
    zoekt_indexing_temporary_space_factor = models.FloatField(
        "Temporary space of a build, per byte of index",
        default=1.0,
        help_text="A build writes its new shards before the old ones go: while it runs it takes "
        "this many bytes per byte of the repository's index on its node's disk. Admission "
        "control keeps the node under its build ceiling with them. At least 0.",
    )
    zoekt_node_restart_delay_seconds = models.IntegerField(
        "Default allowed delay of a node restart (seconds)",
        default=1800,
        help_text="How long a node whose restart an operator requested is left alone: "
        "not handled as lost, not re-indexed, given no new placement, its indices kept "
        "(docs/operations.md). A request may give its own delay.",
    )
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        db_table = "application_settings"
        verbose_name = "application settings"
        verbose_name_plural = "application settings"
        constraints = [
            models.CheckConstraint(condition=Q(id=1), name="check_application_settings_singleton"),
            models.CheckConstraint(
                condition=Q(zoekt_cpu_to_tasks_ratio__gt=0),
                name="check_zoekt_cpu_to_tasks_ratio_positive",
            ),
            models.CheckConstraint(
                condition=Q(zoekt_force_reindexing_percentage__gte=0)
                & Q(zoekt_force_reindexing_percentage__lte=100),
                name="check_zoekt_force_reindexing_percentage_range",
            ),
            models.CheckConstraint(
                condition=Q(zoekt_indexing_parallelism__gt=0),
                name="check_zoekt_indexing_parallelism_positive",
            ),
            models.CheckConstraint(
                condition=Q(zoekt_rollout_batch_size__gt=0),
                name="check_zoekt_rollout_batch_size_positive",
            ),
            models.CheckConstraint(
                condition=Q(zoekt_maximum_files__gt=0), name="check_zoekt_maximum_files_positive"
            ),
            models.CheckConstraint(
                condition=Q(zoekt_trigram_max__gt=0), name="check_zoekt_trigram_max_positive"
            ),
            models.CheckConstraint(
                condition=Q(zoekt_default_number_of_replicas__gt=0),
                name="check_zoekt_default_number_of_replicas_positive",
            ),
            models.CheckConstraint(
                condition=Q(zoekt_max_restarts_15m__gte=0),
                name="check_zoekt_max_restarts_15m_non_negative",
            ),
            models.CheckConstraint(
                condition=Q(zoekt_initial_indexing_limit__gt=0),
                name="check_zoekt_initial_indexing_limit_positive",
            ),
            models.CheckConstraint(
                condition=Q(zoekt_memory_ratio__gt=0), name="check_zoekt_memory_ratio_positive"
            ),
            models.CheckConstraint(
                condition=Q(zoekt_node_memory_budget_bytes__isnull=True)
                | Q(zoekt_node_memory_budget_bytes__gt=0),
                name="check_zoekt_node_memory_budget_bytes_positive",
            ),
            models.CheckConstraint(
                condition=Q(zoekt_node_restart_delay_seconds__gt=0),
                name="check_zoekt_node_restart_delay_seconds_positive",
            ),
            models.CheckConstraint(
                condition=Q(zoekt_rebalance_margin__gte=0) & Q(zoekt_rebalance_margin__lt=1),
                name="check_zoekt_rebalance_margin_range",
            ),
            models.CheckConstraint(
                condition=Q(zoekt_indexing_temporary_space_factor__gte=0),
                name="check_zoekt_indexing_temporary_space_factor",
            ),
            models.CheckConstraint(
                condition=Q(zoekt_indexing_admission__in=["admission", "gitlab"]),
                name="check_zoekt_indexing_admission",
            ),
            models.CheckConstraint(
                condition=Q(zoekt_rebalance_max_moves__gt=0),
                name="check_zoekt_rebalance_max_moves_positive",
            ),
        ]

    def __str__(self) -> str:
        return "Zoekt application settings"

    def clean(self) -> None:
        from zoekt.app_settings import validate_setting_values

        validate_setting_values(self)


# ----------------------------------------------------------------------------
# The audit trail of operator actions (docs/operations.md, "Audit trail")
# ----------------------------------------------------------------------------


class AppendOnly(Exception):
    """An audit event is never changed or deleted once written."""


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AppendOnly("audit events are append-only: no update")

    def delete(self):
        raise AppendOnly("audit events are append-only: no delete")


class AuditEvent(models.Model):
    """One operator action through the admin, the API or a command, with its outcome.

    GitLab's ``audit_events`` names (``author_id``, ``author_name``,
    ``ip_address``, ``event_name``, ``target_type``, ``target_id``,
    ``target_details``, ``details``), plus ``via`` (the surface), ``outcome``
    and ``reason``. Append-only: ``save`` of a stored row and ``delete`` raise
    ``AppendOnly``, so do the queryset's ``update`` and ``delete``, and a
    trigger in the database refuses UPDATE and DELETE (migration 0017).
    Written by ``zoekt.audit`` only.
    """

    class Via(models.TextChoices):
        ADMIN = "admin"
        API = "api"
        COMMAND = "command"
        #: A domain call with no surface (a shell, a test): recorded all the same.
        INTERNAL = "internal"

    class Outcome(models.TextChoices):
        OK = "ok"
        REFUSED = "refused"
        ERROR = "error"

    created_at = models.DateTimeField(default=clock.now, editable=False)
    #: The Django user's id (None for a command's OS user, or an unknown one).
    author_id = models.BigIntegerField(null=True, blank=True)
    #: The username at the time (kept when the user is renamed or deleted).
    author_name = models.CharField(max_length=255)
    via = models.CharField(max_length=16, choices=Via.choices)
    #: The client's address (REMOTE_ADDR), or the host a command ran on.
    ip_address = models.CharField(max_length=255, blank=True, default="")
    #: The action, a stable snake_case code (``zoekt.audit.Action``).
    event_name = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64, blank=True, default="")
    target_id = models.BigIntegerField(null=True, blank=True)
    #: A label for the target at the time (a node's name, a namespace's path).
    target_details = models.CharField(max_length=255, blank=True, default="")
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    #: Why it was refused or failed: a stable code (``zoekt.reasons`` or the error's).
    reason = models.CharField(max_length=64, blank=True, default="")
    details = models.JSONField(default=dict, blank=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        db_table = "audit_events"
        indexes = [
            models.Index(fields=["-created_at", "-id"], name="audit_events_newest"),
            models.Index(fields=["event_name", "-id"], name="audit_events_event_name"),
            models.Index(fields=["author_name", "-id"], name="audit_events_author_name"),
        ]

    def __str__(self) -> str:
        return f"{self.event_name} by {self.author_name} via {self.via}: {self.outcome}"

    def save(self, *args, **kwargs) -> None:
        if not self._state.adding:
            raise AppendOnly("audit events are append-only: a stored event is not changed")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnly("audit events are append-only: no delete")
