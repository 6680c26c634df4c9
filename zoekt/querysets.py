"""Named queries over the fleet tables (GitLab's scopes, reference section 1).

Every time-dependent query takes ``now`` from ``zoekt.clock`` (or the caller),
never the database's ``now()``, so a stepped or simulated clock rules them
all. Unclaimed storage is computed in SQL: usable bytes minus the sum of
every index's reservation on the node, in any state.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.apps import apps
from django.db import models
from django.db.models import (
    Case,
    Exists,
    F,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from zoekt import app_settings, capacity, clock, search_health


def _model(name: str) -> type[models.Model]:
    return apps.get_model("zoekt", name)


class NamespaceQuerySet(models.QuerySet):
    def roots(self) -> NamespaceQuerySet:
        return self.filter(parent__isnull=True)

    def top_level_groups(self) -> NamespaceQuerySet:
        return self.filter(parent__isnull=True, type="Group")

    def project_namespaces_under(self, root_id: int) -> NamespaceQuerySet:
        """Every project namespace whose ancestry starts at ``root_id``."""
        return self.filter(type="Project", traversal_ids__0=root_id)


class NodeQuerySet(models.QuerySet):
    # --- liveness -------------------------------------------------------------------------
    def online(self, now: datetime | None = None) -> NodeQuerySet:
        now = now or clock.now()
        return self.filter(
            last_seen_at__gt=now - timedelta(seconds=capacity.ONLINE_DURATION_THRESHOLD_SECONDS)
        )

    def offline(self, now: datetime | None = None) -> NodeQuerySet:
        now = now or clock.now()
        return self.exclude(
            last_seen_at__gt=now - timedelta(seconds=capacity.ONLINE_DURATION_THRESHOLD_SECONDS)
        )

    def lost(self, threshold_seconds: int | None, now: datetime | None = None) -> NodeQuerySet:
        """Nodes unseen for longer than the threshold (strict ``<`` as GitLab's scope)."""
        if not threshold_seconds:
            return self.none()
        now = now or clock.now()
        return self.filter(last_seen_at__lt=now - timedelta(seconds=threshold_seconds))

    def for_search(self) -> NodeQuerySet:
        return self.filter(services__contains=[_model("Node").Service.ZOEKT])

    # --- maintenance (docs/operations.md) ------------------------------------------------
    # ``in_restart``: what lost-node handling, the lost-index-data check and search
    # routing leave alone. ``in_shutdown``: what placement, move targets, eviction and
    # memory-pressure moves leave alone (a restart, a drain, a drained node).
    @staticmethod
    def restart_hold(now: datetime | None = None) -> Exists:
        """True for a node with a live restart record still within its allowed delay."""
        return Exists(
            _model("NodeShutdown")
            .objects.live()
            .filter(node=OuterRef("pk"), type="restart", delay_expires_at__gt=now or clock.now())
        )

    def in_restart(self, now: datetime | None = None) -> NodeQuerySet:
        """Nodes an operator is restarting, within the allowed delay: left alone."""
        return self.filter(self.restart_hold(now))

    def not_in_restart(self, now: datetime | None = None) -> NodeQuerySet:
        return self.filter(~self.restart_hold(now))

    @staticmethod
    def shutdown_hold(now: datetime | None = None) -> Exists:
        """True for a node an operator is taking out of service: a live restart within its
        allowed delay, a live remove or replace (a drain), or a complete drain whose node
        no operator has returned to service (Elasticsearch: a node with a shutdown record
        stays excluded until the record is deleted)."""
        drains = ("remove", "replace")
        held = (
            Q(status__in=("in_progress", "stalled"), type="restart")
            & Q(delay_expires_at__gt=now or clock.now())
            | Q(status__in=("in_progress", "stalled"), type__in=drains)
            | Q(status="complete", type__in=drains, returned_to_service_at__isnull=True)
        )
        return Exists(_model("NodeShutdown").objects.filter(held, node=OuterRef("pk")))

    def in_shutdown(self, now: datetime | None = None) -> NodeQuerySet:
        """Nodes that take nothing new (placement, move targets) and are chosen for no
        eviction or move: being restarted, drained, or drained and not yet returned."""
        return self.filter(self.shutdown_hold(now))

    def not_in_shutdown(self, now: datetime | None = None) -> NodeQuerySet:
        return self.filter(~self.shutdown_hold(now))

    def searchable(self, now: datetime | None = None) -> NodeQuerySet:
        """Nodes a search may go to: online, for_search, and healthy by ``zoekt.search_health``.

        The health rule (restarts, mmap ratio, webserver staleness, and the
        fleet-wide version gate) runs in Python over the metadata of every
        online node, fetched in one query; the result filters this queryset
        by id. So the cost is one query at call time plus the usual one when
        the result is read (and a settings read, from the cache), whatever
        the number of nodes. It is not SQL over jsonb because the rule parses
        version strings and compares an exact ratio: one
        Python definition shared with the API and the tests cannot drift from
        a second one in SQL, and the online set is bounded by the fleet size.
        The gate looks at every online node in the table, not only at the
        nodes this queryset is filtered to.
        """
        from zoekt import app_settings

        now = now or clock.now()
        online = {
            node_id: (metadata, seen)
            for node_id, metadata, seen in self.model.objects.online(now).values_list(
                "id", "metadata", "webserver_last_seen_at"
            )
        }
        excluded = search_health.search_exclusions(
            online, now=now, max_restarts=app_settings.current().max_restarts_15m
        )
        eligible = self.online(now).for_search()
        if excluded:
            eligible = eligible.exclude(pk__in=sorted(excluded))
        return eligible

    def with_pending_indices(self) -> NodeQuerySet:
        Index = _model("Index")
        return self.filter(
            Exists(Index.objects.filter(zoekt_node=OuterRef("pk"), state=Index.State.PENDING))
        )

    # --- capacity ------------------------------------------------------------------------
    def with_unclaimed_storage_bytes(self) -> NodeQuerySet:
        """Annotate ``annotated_reserved_storage_bytes`` and ``annotated_unclaimed_...``."""
        Index = _model("Index")
        reserved = (
            Index.objects.filter(zoekt_node=OuterRef("pk"))
            .order_by()
            .values("zoekt_node")
            .annotate(total=Sum("reserved_storage_bytes"))
            .values("total")
        )
        return self.annotate(
            annotated_reserved_storage_bytes=Coalesce(
                Subquery(reserved, output_field=models.BigIntegerField()), Value(0)
            ),
        ).annotate(
            annotated_unclaimed_storage_bytes=F("usable_storage_bytes")
            - F("annotated_reserved_storage_bytes")
        )

    def with_positive_unclaimed_storage_bytes(self) -> NodeQuerySet:
        return self.with_unclaimed_storage_bytes().filter(annotated_unclaimed_storage_bytes__gt=0)

    def not_in_eviction_cooldown(self, now: datetime | None = None) -> NodeQuerySet:
        """Nodes an eviction has not put in cooldown (or whose cooldown is over)."""
        now = now or clock.now()
        return self.filter(
            Q(eviction_cooldown_until__isnull=True) | Q(eviction_cooldown_until__lte=now)
        )

    def negative_unclaimed_storage_bytes(self) -> NodeQuerySet:
        return self.with_unclaimed_storage_bytes().filter(annotated_unclaimed_storage_bytes__lt=0)

    def order_by_unclaimed_space_desc(self) -> NodeQuerySet:
        return self.with_positive_unclaimed_storage_bytes().order_by(
            F("annotated_unclaimed_storage_bytes").desc(), "id"
        )

    def available_for_search_indexing(self, now: datetime | None = None) -> NodeQuerySet:
        """The planner's pool: online search nodes with room, most unclaimed first."""
        return self.for_search().online(now).order_by_unclaimed_space_desc()

    def maximum_schema_version(self, now: datetime | None = None) -> int | None:
        return self.online(now).aggregate(m=models.Max("schema_version"))["m"]

    # --- disk watermarks (storage_percent_used >= limit) -----------------------------
    def _percent_at_least(self, limit: float) -> NodeQuerySet:
        # used / total >= limit  <=>  used >= limit * total, for total > 0.
        return self.filter(total_bytes__gt=0, used_bytes__gte=F("total_bytes") * limit)

    # ``development`` None follows app_settings.development_watermarks(), as the model does.
    def _limit(self, which: int, development: bool | None) -> float:
        if development is None:
            development = app_settings.development_watermarks()
        return capacity.watermark_limits(development)[which]

    def low_watermark_exceeded(self, development: bool | None = None) -> NodeQuerySet:
        return self._percent_at_least(self._limit(0, development))

    def high_watermark_exceeded(self, development: bool | None = None) -> NodeQuerySet:
        return self._percent_at_least(self._limit(1, development))

    def critical_watermark_exceeded(self, development: bool | None = None) -> NodeQuerySet:
        return self._percent_at_least(self._limit(2, development))


class EnabledNamespaceQuerySet(models.QuerySet):
    def search_enabled(self) -> EnabledNamespaceQuerySet:
        return self.filter(search=True)

    def search_disabled(self) -> EnabledNamespaceQuerySet:
        return self.filter(search=False)

    def with_missing_indices(self) -> EnabledNamespaceQuerySet:
        Index = _model("Index")
        return self.exclude(Exists(Index.objects.filter(zoekt_enabled_namespace=OuterRef("pk"))))

    def with_replica_count(self) -> EnabledNamespaceQuerySet:
        return self.annotate(replica_count=models.Count("replicas", distinct=True))

    def with_mismatched_replicas(self, default_number_of_replicas: int) -> EnabledNamespaceQuerySet:
        """Replica count (any state) differs from the override, else from the default."""
        return (
            self.with_replica_count()
            .annotate(
                desired_replicas=Coalesce(
                    F("number_of_replicas_override"), Value(default_number_of_replicas)
                )
            )
            .exclude(replica_count=F("desired_replicas"))
        )

    def with_rollout_allowed(
        self, retry_interval_seconds: int | None, now: datetime | None = None
    ) -> EnabledNamespaceQuerySet:
        """Never failed, or failed before the retry interval (None disables retries)."""
        allowed = Q(last_rollout_failed_at__isnull=True)
        if retry_interval_seconds:
            now = now or clock.now()
            allowed |= Q(last_rollout_failed_at__lt=now - timedelta(seconds=retry_interval_seconds))
        return self.filter(allowed)

    def with_rollout_blocked(
        self, retry_interval_seconds: int | None, now: datetime | None = None
    ) -> EnabledNamespaceQuerySet:
        allowed = self.model.objects.with_rollout_allowed(retry_interval_seconds, now)
        return self.exclude(pk__in=allowed.values("pk"))


class ReplicaQuerySet(models.QuerySet):
    def for_namespace(self, namespace_id: int) -> ReplicaQuerySet:
        return self.filter(namespace_id=namespace_id)

    def _has_index(self, **filters) -> Exists:
        Index = _model("Index")
        return Exists(Index.objects.filter(zoekt_replica=OuterRef("pk"), **filters))

    def without_indices(self) -> ReplicaQuerySet:
        return self.exclude(self._has_index())

    def with_non_ready_indices(self) -> ReplicaQuerySet:
        Index = _model("Index")
        return self.filter(
            Exists(
                Index.objects.filter(zoekt_replica=OuterRef("pk")).exclude(state=Index.State.READY)
            )
        )

    def with_all_ready_indices(self) -> ReplicaQuerySet:
        """At least one index, and every index ready."""
        Index = _model("Index")
        not_ready = Index.objects.filter(zoekt_replica=OuterRef("pk")).exclude(
            state=Index.State.READY
        )
        return self.filter(self._has_index()).exclude(Exists(not_ready))


class IndexQuerySet(models.QuerySet):
    def pre_ready(self) -> IndexQuerySet:
        return self.filter(state__in=self.model.PRE_READY_STATES)

    def searchable(self) -> IndexQuerySet:
        return self.filter(state=self.model.State.READY, zoekt_enabled_namespace__search=True)

    def for_root_namespace_id(self, root_namespace_id: int) -> IndexQuerySet:
        return self.filter(namespace_id=root_namespace_id, zoekt_enabled_namespace__isnull=False)

    def with_all_finished_repositories(self) -> IndexQuerySet:
        Repository = _model("Repository")
        unfinished = Repository.objects.filter(zoekt_index=OuterRef("pk")).exclude(
            state__in=(Repository.State.READY, Repository.State.FAILED)
        )
        return self.exclude(Exists(unfinished))

    def with_stale_used_storage_bytes_updated_at(self) -> IndexQuerySet:
        return self.filter(last_indexed_at__gte=F("used_storage_bytes_updated_at"))

    def with_latest_used_storage_bytes_updated_at(self) -> IndexQuerySet:
        return self.filter(last_indexed_at__lt=F("used_storage_bytes_updated_at"))

    def negative_reserved_storage_bytes(self) -> IndexQuerySet:
        return self.filter(reserved_storage_bytes__lt=0)

    def should_be_marked_as_orphaned(self) -> IndexQuerySet:
        return self.filter(
            Q(zoekt_enabled_namespace__isnull=True) | Q(zoekt_replica__isnull=True)
        ).exclude(state__in=self.model.SHOULD_BE_DELETED_STATES)

    def should_be_pending_eviction(self) -> IndexQuerySet:
        Index = self.model
        return self.filter(
            watermark_level=Index.WatermarkLevel.CRITICAL_WATERMARK_EXCEEDED
        ).exclude(state__in=(*Index.EVICTION_STATES, *Index.SHOULD_BE_DELETED_STATES))

    def should_be_deleted(self) -> IndexQuerySet:
        return self.filter(state__in=self.model.SHOULD_BE_DELETED_STATES)

    def with_sql_watermark_level(self) -> IndexQuerySet:
        """Annotate ``sql_watermark_level``: GitLab's SQL calculation (reference 2.2).

        It differs from the stored (Ruby) calculation only for a negative
        ratio, which it calls overprovisioned rather than critical.
        """
        Level = self.model.WatermarkLevel
        no_reservation = Q(reserved_storage_bytes__isnull=True) | Q(reserved_storage_bytes=0)
        return self.alias(
            watermark_ratio=Case(
                When(no_reservation, then=Value(None)),
                default=F("used_storage_bytes") * 1.0 / F("reserved_storage_bytes"),
                output_field=models.FloatField(),
            )
        ).annotate(
            sql_watermark_level=Case(
                When(no_reservation, then=Value(Level.CRITICAL_WATERMARK_EXCEEDED)),
                When(
                    watermark_ratio__lt=capacity.STORAGE_IDEAL_PERCENT_USED,
                    then=Value(Level.OVERPROVISIONED),
                ),
                When(watermark_ratio__lt=capacity.STORAGE_LOW_WATERMARK, then=Value(Level.HEALTHY)),
                When(
                    watermark_ratio__lt=capacity.STORAGE_HIGH_WATERMARK,
                    then=Value(Level.LOW_WATERMARK_EXCEEDED),
                ),
                When(
                    watermark_ratio__lt=capacity.STORAGE_CRITICAL_WATERMARK,
                    then=Value(Level.HIGH_WATERMARK_EXCEEDED),
                ),
                default=Value(Level.CRITICAL_WATERMARK_EXCEEDED),
                output_field=models.SmallIntegerField(),
            )
        )

    def with_mismatched_watermark_levels(self) -> IndexQuerySet:
        return self.with_sql_watermark_level().exclude(watermark_level=F("sql_watermark_level"))


class RepositoryQuerySet(models.QuerySet):
    def uncompleted(self) -> RepositoryQuerySet:
        State = self.model.State
        return self.exclude(state__in=(State.READY, State.FAILED))

    def should_be_indexed(self) -> RepositoryQuerySet:
        return self.filter(state=self.model.State.PENDING)

    def should_be_reindexed(self, maximum_schema_version: int | None) -> RepositoryQuerySet:
        if maximum_schema_version is None:
            return self.none()
        return self.filter(
            state__in=self.model.INDEXABLE_STATES, schema_version__lt=maximum_schema_version
        )

    def should_be_deleted(self) -> RepositoryQuerySet:
        State = self.model.State
        return self.filter(state__in=(State.ORPHANED, State.PENDING_DELETION))

    def should_be_marked_as_orphaned(self) -> RepositoryQuerySet:
        return self.filter(project__isnull=True).exclude(state=self.model.State.ORPHANED)


class MoveQuerySet(models.QuerySet):
    def live(self):
        """Moves holding their lease: planned, building, ready to swap or swapping."""
        return self.filter(state__in=("planned", "building", "ready_to_swap", "swapping"))


class NodeShutdownQuerySet(models.QuerySet):
    def live(self):
        """Records in progress or stalled (one per node at most)."""
        return self.filter(status__in=("in_progress", "stalled"))


class TaskQuerySet(models.QuerySet):
    def perform_now(self, now: datetime | None = None) -> TaskQuerySet:
        return self.filter(perform_at__lte=now or clock.now())

    def pending_or_processing(self) -> TaskQuerySet:
        State = self.model.State
        return self.filter(state__in=(State.PENDING, State.PROCESSING))

    def processing_queue(self, now: datetime | None = None) -> TaskQuerySet:
        return self.perform_now(now).pending_or_processing()

    def join_nodes(self) -> TaskQuerySet:
        """Only tasks whose node still exists (there is no foreign key)."""
        Node = _model("Node")
        return self.filter(Exists(Node.objects.filter(pk=OuterRef("zoekt_node_id"))))
