"""The Django admin: what an operator scans to see the state of the fleet.

Everything a heartbeat, callback or background job writes is shown read-only.
Of the Zoekt tables the operator edits an enabled namespace's ``search``
switch and replica override (and may add or delete enabled namespaces), a
node's ``usable_storage_bytes_locked_until``, and the application settings (a
single row). Replicas, indices, repositories and tasks are view-only (a
replica may be deleted, which orphans its indices for the deletion pipeline);
nodes register themselves through heartbeats, so they cannot be added here.
The mirrored GitLab core tables (namespaces, projects, statistics) stay
editable apart from timestamps and traversal ids.

The node changelist computes its columns (index count, unclaimed storage) in
the SQL that fetches the rows, so it costs the same number of queries for 3
nodes as for 3,000; its memory columns (webserver RSS over the node's memory
budget, and the memory watermark beside the disk one; ``zoekt.memory``) come
from the reported metadata and the cached settings, without a query.
Liveness (online/offline) follows GitLab's 30-second rule read from
``zoekt.clock``.
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.db.models import Case, Count, F, FloatField, Q, Value, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.html import format_html

from zoekt import app_settings, capacity, memory, node_deletion, shutdowns
from zoekt.audit import Action, Actor, Target, Via, audited, changed_values, record_refusal
from zoekt.capacity import NodeWatermark
from zoekt.models import (
    ApplicationSetting,
    AuditEvent,
    EnabledNamespace,
    ForkNetworkMember,
    HandledTaskFailure,
    Index,
    Namespace,
    NamespaceRootStorageStatistics,
    Node,
    NodeShutdown,
    Project,
    ProjectFeature,
    ProjectStatistics,
    Replica,
    Repository,
    Task,
)
from zoekt.units import binary_size

admin.site.site_header = "zoekt-control"
admin.site.site_title = "zoekt-control admin"
admin.site.index_title = "Zoekt fleet administration"

EMPTY = "-"
TIMESTAMPS = ("created_at", "updated_at")


# ----------------------------------------------------------------------------
# Formatting helpers
# ----------------------------------------------------------------------------


def human_bytes(value: int | None) -> str:
    """A byte count as ``1.5 GiB``; negative counts keep their sign; ``-`` for None."""
    if value is None:
        return EMPTY
    return binary_size(value)


def bytes_cell(value: int | None) -> str:
    """``human_bytes`` with the exact count in a tooltip."""
    if value is None:
        return EMPTY
    return format_html('<span title="{} bytes">{}</span>', value, human_bytes(value))


def bytes_column(attr: str, description: str, ordering: str | None = None):
    """A changelist/detail column showing ``obj.<attr>`` as a human-readable size."""

    @admin.display(description=description, ordering=ordering)
    def column(self, obj) -> str:
        return bytes_cell(getattr(obj, attr))

    return column


def percent(ratio: float | None) -> str:
    if ratio is None:
        return EMPTY
    return f"{ratio * 100:.1f}%"


def coloured(label: str, colour: str) -> str:
    return format_html('<strong style="color: {};">{}</strong>', colour, label)


def admin_link(obj, label: object | None = None) -> str:
    """A link to ``obj``'s change page in this admin."""
    if obj is None:
        return EMPTY
    opts = obj._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, obj if label is None else label)


def changelist_link(model, label: object, **params) -> str:
    """A link to ``model``'s changelist filtered by ``params``."""
    opts = model._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    query = "&".join(f"{key}={value}" for key, value in params.items())
    return format_html('<a href="{}?{}">{}</a>', url, query, label)


def pretty_json(value) -> str:
    return format_html(
        '<pre style="margin: 0;">{}</pre>', json.dumps(value, indent=2, sort_keys=True)
    )


NODE_WATERMARK_COLOURS = {
    NodeWatermark.NORMAL: "#2e7d32",
    NodeWatermark.LOW: "#b8860b",
    NodeWatermark.HIGH: "#e65100",
    NodeWatermark.CRITICAL: "#c62828",
}

INDEX_WATERMARK_COLOURS = {
    Index.WatermarkLevel.HEALTHY: "#2e7d32",
    Index.WatermarkLevel.OVERPROVISIONED: "#1565c0",
    Index.WatermarkLevel.LOW_WATERMARK_EXCEEDED: "#b8860b",
    Index.WatermarkLevel.HIGH_WATERMARK_EXCEEDED: "#e65100",
    Index.WatermarkLevel.CRITICAL_WATERMARK_EXCEEDED: "#c62828",
}


# used_bytes / total_bytes in SQL (0 when the node reports no disk), for sorting.
STORAGE_PERCENT_USED = Case(
    When(total_bytes__gt=0, then=Cast("used_bytes", FloatField()) / F("total_bytes")),
    default=Value(0.0),
    output_field=FloatField(),
)


class SaveChangedFieldsMixin:
    """Save only the fields the operator changed, never stale copies of the rest.

    A heartbeat or job may update the row between the admin loading the form
    and saving it; a full ``save()`` would write the old values back.
    """

    def save_model(self, request, obj, form, change):
        if not change:
            super().save_model(request, obj, form, change)
            return
        concrete = {field.name for field in obj._meta.concrete_fields}
        fields = [name for name in form.changed_data if name in concrete]
        if fields:
            obj.save(update_fields=[*fields, "updated_at"])


def admin_actor(request) -> Actor:
    """The signed-in operator of an admin request, for the audit trail."""
    return Actor.from_request(request, Via.ADMIN)


class AuditedSaveMixin:
    """An operator's edit in the admin, recorded in the audit trail with each changed
    field's old and new value: ``audit_action(change)`` names it, ``audit_target(obj)``
    its row."""

    def audit_action(self, change: bool) -> str:
        raise NotImplementedError

    def audit_target(self, obj) -> Target:
        raise NotImplementedError

    def save_model(self, request, obj, form, change):
        changed = [name for name in form.changed_data if name not in ("root_namespace",)]
        before = {name: form.initial.get(name) for name in changed}
        after = {name: form.cleaned_data.get(name) for name in changed}
        with audited(
            admin_actor(request), self.audit_action(change), self.audit_target(obj)
        ) as entry:
            super().save_model(request, obj, form, change)
            entry.details["changes"] = changed_values(before, after)


class ViewOnlyMixin:
    """Rows the control plane writes and the operator only inspects."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# ----------------------------------------------------------------------------
# GitLab's core model
# ----------------------------------------------------------------------------


@admin.register(Namespace)
class NamespaceAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "name",
        "path",
        "type",
        "parent_link",
        "traversal_ids",
        "archived",
        "created_at",
    )
    list_filter = ("type", "archived")
    search_fields = ("name", "path", "id__exact")
    list_select_related = ("parent",)
    raw_id_fields = ("parent",)
    readonly_fields = ("traversal_ids", *TIMESTAMPS)
    fields = (
        "name",
        "path",
        "type",
        "parent",
        "traversal_ids",
        "visibility_level",
        "archived",
        *TIMESTAMPS,
    )

    @admin.display(description="parent", ordering="parent_id")
    def parent_link(self, obj: Namespace) -> str:
        return admin_link(obj.parent)

    def get_readonly_fields(self, request, obj=None):
        # Moving a namespace would leave its descendants' traversal ids stale.
        if obj is not None:
            return (*self.readonly_fields, "parent")
        return self.readonly_fields

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if not change:
            parent_ids = list(obj.parent.traversal_ids) if obj.parent_id else []
            obj.traversal_ids = [*parent_ids, obj.id]
            obj.save(update_fields=["traversal_ids"])


class ProjectFeatureInline(admin.StackedInline):
    model = ProjectFeature
    can_delete = False
    readonly_fields = TIMESTAMPS


class ForkNetworkMemberInline(admin.StackedInline):
    model = ForkNetworkMember
    fk_name = "project"
    can_delete = False
    raw_id_fields = ("forked_from_project",)


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "name",
        "path",
        "namespace",
        "project_namespace_id",
        "visibility_level",
        "archived",
        "created_at",
    )
    list_filter = ("archived",)
    search_fields = ("name", "path", "id__exact")
    list_select_related = ("namespace",)
    raw_id_fields = ("namespace", "project_namespace")
    readonly_fields = TIMESTAMPS
    inlines = (ProjectFeatureInline, ForkNetworkMemberInline)


@admin.register(ProjectFeature)
class ProjectFeatureAdmin(admin.ModelAdmin):
    list_display = ("id", "project", "repository_access_level", "updated_at")
    list_filter = ("repository_access_level",)
    search_fields = ("project__name", "project_id__exact")
    list_select_related = ("project",)
    raw_id_fields = ("project",)
    readonly_fields = TIMESTAMPS


@admin.register(ForkNetworkMember)
class ForkNetworkMemberAdmin(admin.ModelAdmin):
    list_display = ("id", "project", "forked_from_project")
    search_fields = ("project__name", "project_id__exact")
    list_select_related = ("project", "forked_from_project")
    raw_id_fields = ("project", "forked_from_project")


class StorageSizesMixin:
    """The two size columns shared by the statistics tables."""

    repository_size_display = bytes_column(
        "repository_size", description="repository size", ordering="repository_size"
    )
    storage_size_display = bytes_column(
        "storage_size", description="storage size", ordering="storage_size"
    )


@admin.register(ProjectStatistics)
class ProjectStatisticsAdmin(StorageSizesMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "project",
        "namespace_id",
        "repository_size_display",
        "storage_size_display",
        "updated_at",
    )
    search_fields = ("project__name", "project_id__exact", "namespace_id__exact")
    list_select_related = ("project",)
    raw_id_fields = ("project",)
    readonly_fields = ("updated_at",)


@admin.register(NamespaceRootStorageStatistics)
class NamespaceRootStorageStatisticsAdmin(StorageSizesMixin, admin.ModelAdmin):
    list_display = ("namespace", "repository_size_display", "storage_size_display", "updated_at")
    search_fields = ("namespace__name", "namespace__path", "namespace_id__exact")
    list_select_related = ("namespace",)
    raw_id_fields = ("namespace",)
    readonly_fields = ("updated_at",)


# ----------------------------------------------------------------------------
# Nodes
# ----------------------------------------------------------------------------


class OnlineFilter(admin.SimpleListFilter):
    """Seen within the last 30 s (by ``zoekt.clock``), or not."""

    title = "liveness"
    parameter_name = "liveness"

    def lookups(self, request, model_admin):
        return (("online", "Online"), ("offline", "Offline"))

    def queryset(self, request, queryset):
        if self.value() == "online":
            return queryset.online()
        if self.value() == "offline":
            return queryset.offline()
        return queryset


class DiskWatermarkFilter(admin.SimpleListFilter):
    """The node's disk bucket; each node falls in its highest one only."""

    title = "disk watermark"
    parameter_name = "disk_watermark"

    def lookups(self, request, model_admin):
        return [(level.value, level.value) for level in NodeWatermark]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        low, high, critical = capacity.watermark_limits(app_settings.development_watermarks())

        def at_least(limit: float) -> Q:
            # used / total >= limit  <=>  used >= limit * total, for total > 0.
            return Q(total_bytes__gt=0, used_bytes__gte=F("total_bytes") * limit)

        if value == NodeWatermark.CRITICAL:
            return queryset.filter(at_least(critical))
        if value == NodeWatermark.HIGH:
            return queryset.filter(at_least(high)).exclude(at_least(critical))
        if value == NodeWatermark.LOW:
            return queryset.filter(at_least(low)).exclude(at_least(high))
        if value == NodeWatermark.NORMAL:
            return queryset.exclude(at_least(low))
        return queryset


@admin.register(Node)
class NodeAdmin(AuditedSaveMixin, SaveChangedFieldsMixin, admin.ModelAdmin):
    list_display = (
        "name_display",
        "uuid",
        "disk_percent_used",
        "disk_watermark",
        "memory_percent_used",
        "memory_watermark",
        "memory_budget",
        "webserver_rss",
        "online",
        "index_count",
        "unclaimed_storage",
        "last_seen_at",
        "version_display",
        "schema_version",
        "zone",
    )
    list_filter = (OnlineFilter, DiskWatermarkFilter, "schema_version", "zone")
    search_fields = ("uuid", "metadata__name", "index_base_url", "search_base_url")
    ordering = ("id",)
    actions = ("request_restart", "request_drain", "cancel_shutdown", "delete_selected")
    fieldsets = (
        (
            "Identity",
            {
                "fields": (
                    "uuid",
                    "name_display",
                    "version_display",
                    "index_base_url",
                    "search_base_url",
                    "services_display",
                    "schema_version",
                )
            },
        ),
        ("Liveness", {"fields": ("last_seen_at", "online")}),
        ("Failure domain", {"fields": ("zone",)}),
        (
            "Disk",
            {
                "fields": (
                    "total_bytes_display",
                    "used_bytes_display",
                    "indexed_bytes_display",
                    "disk_percent_used",
                    "disk_watermark",
                )
            },
        ),
        (
            "Memory",
            {
                "fields": (
                    "webserver_rss",
                    "shards_loaded",
                    "reported_memory_limit",
                    "memory_budget",
                    "memory_percent_used",
                    "memory_watermark",
                )
            },
        ),
        (
            "Capacity",
            {
                "fields": (
                    "usable_storage_bytes_display",
                    "reserved_storage",
                    "unclaimed_storage",
                    "index_count",
                    "usable_storage_bytes_locked_until",
                )
            },
        ),
        ("Reported metadata", {"fields": ("metadata_display",)}),
        ("Record", {"fields": TIMESTAMPS}),
    )
    # Every column a heartbeat writes; the lock and the zone are the operator's knobs.
    readonly_fields = (
        "uuid",
        "index_base_url",
        "search_base_url",
        "services",
        "schema_version",
        "last_seen_at",
        "metadata",
        "used_bytes",
        "total_bytes",
        "indexed_bytes",
        "usable_storage_bytes",
        *TIMESTAMPS,
        "name_display",
        "version_display",
        "services_display",
        "online",
        "total_bytes_display",
        "used_bytes_display",
        "indexed_bytes_display",
        "disk_percent_used",
        "disk_watermark",
        "webserver_rss",
        "shards_loaded",
        "reported_memory_limit",
        "memory_budget",
        "memory_percent_used",
        "memory_watermark",
        "usable_storage_bytes_display",
        "reserved_storage",
        "unclaimed_storage",
        "index_count",
        "metadata_display",
    )

    def has_add_permission(self, request):
        return False  # nodes register themselves with their first heartbeat

    # The zone (the one editable text column) is a short label: one line, not a text
    # area, and left empty it is no zone (NULL), as the database's check wants.
    formfield_overrides = {
        models.TextField: {"widget": forms.TextInput(attrs={"size": 30}), "empty_value": None}
    }

    def audit_action(self, change: bool) -> str:
        return Action.NODE_UPDATED  # the storage lock and the zone, the operator's fields

    def audit_target(self, obj: Node) -> Target:
        return shutdowns.node_target(obj.id, obj)

    @admin.action(description="Request a restart (kept for the default delay)")
    def request_restart(self, request, queryset):
        """A restart record per selected node, by the signed-in operator (docs/operations.md)."""
        self._each(
            request,
            queryset,
            "restart requested",
            lambda node: shutdowns.do_request_node_shutdown(
                node.id,
                type="restart",
                reason="requested from the admin",
                requested_by=request.user.get_username(),
                actor=admin_actor(request),
            ),
        )

    @admin.action(description="Drain (remove): move every index off the node")
    def request_drain(self, request, queryset):
        """A remove record per selected node, by the signed-in operator: the drain job moves
        its indices off; it takes nothing new (docs/operations.md)."""
        self._each(
            request,
            queryset,
            "drain requested",
            lambda node: shutdowns.do_request_node_shutdown(
                node.id,
                type="remove",
                reason="requested from the admin",
                requested_by=request.user.get_username(),
                actor=admin_actor(request),
            ),
        )

    @admin.action(description="Cancel the live shutdown record (or return a drained node)")
    def cancel_shutdown(self, request, queryset):
        self._each(
            request,
            queryset,
            "shutdown cancelled",
            lambda node: shutdowns.do_cancel_node_shutdown(
                node.id, cancelled_by=request.user.get_username(), actor=admin_actor(request)
            ),
        )

    # --- deleting a node: refused while it holds a last ready copy (zoekt.node_deletion) --
    delete_confirmation_template = "admin/zoekt/node/delete_confirmation.html"
    delete_selected_confirmation_template = "admin/zoekt/node/delete_selected_confirmation.html"

    def delete_view(self, request, object_id, extra_context=None):
        """Django's delete page, which names the ranges only this node holds ready and asks
        for a confirmation to force; a refused delete comes back to it with why."""
        extra = dict(extra_context or {})
        if str(object_id).isdigit():
            extra["last_copies"] = node_deletion.last_copies(int(object_id))
        try:
            return super().delete_view(request, object_id, extra)
        except node_deletion.HoldsLastCopy as error:
            # The refusal's own event went with the page's rolled-back transaction.
            record_refusal(
                admin_actor(request),
                Action.NODE_DELETED,
                error,
                target=shutdowns.node_target(int(object_id)),
                force=False,
            )
            self.message_user(request, str(error), messages.ERROR)
            return redirect(request.path)

    def get_deleted_objects(self, objs, request):
        """What a delete takes with it, listed as Django lists it; the node's indices and
        repositories go through ``zoekt.node_deletion`` (their own admins are view-only,
        which would otherwise forbid the delete)."""
        deleted, counts, _perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set(), protected

    def delete_model(self, request, obj):
        node_deletion.do_delete_node(
            obj.id,
            deleted_by=request.user.get_username(),
            force=request.POST.get("force") == "yes",
            actor=admin_actor(request),
        )

    def delete_queryset(self, request, queryset):
        """The bulk delete: every node through the same refusal, all or none (the caller's
        transaction, ``delete_selected``)."""
        force = request.POST.get("force") == "yes"
        for node in queryset.order_by("id"):
            node_deletion.do_delete_node(
                node.id,
                deleted_by=request.user.get_username(),
                force=force,
                actor=admin_actor(request),
            )

    @admin.action(
        description="Delete selected nodes (refused for a node holding a last ready copy)",
        permissions=["delete"],
    )
    def delete_selected(self, request, queryset):
        """Django's bulk delete in one transaction; its confirmation page names each node's
        last ready copies and asks for a confirmation to force."""
        try:
            with transaction.atomic():
                response = django_delete_selected(self, request, queryset)
        except node_deletion.HoldsLastCopy as error:
            # Nothing was deleted, and the events written inside went with the rollback.
            record_refusal(
                admin_actor(request),
                Action.NODE_DELETED,
                error,
                target=Target("node", None, ", ".join(n.name for n in queryset.order_by("id"))),
                force=False,
                node_ids=sorted(queryset.values_list("id", flat=True)),
            )
            self.message_user(request, str(error), messages.ERROR)
            return None
        if response is not None and getattr(response, "context_data", None) is not None:
            response.context_data["last_copies"] = [
                (node, copies)
                for node in queryset.order_by("id")
                if (copies := node_deletion.last_copies(node.id))
            ]
        return response

    def _each(self, request, queryset, done: str, call) -> None:
        for node in queryset.order_by("id"):
            try:
                call(node)
            except shutdowns.OperatorError as error:
                self.message_user(request, f"{node.name}: {error}", messages.WARNING)
            else:
                self.message_user(request, f"{node.name}: {done}", messages.SUCCESS)

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .with_unclaimed_storage_bytes()
            .annotate(annotated_index_count=Count("indices"))
        )

    @admin.display(description="name", ordering=KeyTextTransform("name", "metadata"))
    def name_display(self, obj: Node) -> str:
        return obj.name

    @admin.display(description="version", ordering=KeyTextTransform("version", "metadata"))
    def version_display(self, obj: Node) -> str:
        return obj.version or EMPTY

    @admin.display(description="services")
    def services_display(self, obj: Node) -> str:
        return ", ".join(Node.Service(value).label for value in obj.services)

    @admin.display(description="disk used", ordering=STORAGE_PERCENT_USED)
    def disk_percent_used(self, obj: Node) -> str:
        return percent(obj.storage_percent_used)

    @admin.display(description="disk watermark", ordering=STORAGE_PERCENT_USED)
    def disk_watermark(self, obj: Node) -> str:
        level = obj.watermark
        return coloured(level.value, NODE_WATERMARK_COLOURS[level])

    # --- memory (zoekt.memory): from the metadata and the cached settings, no query ---
    @staticmethod
    def _memory(obj: Node) -> tuple[int | None, str | None, float | None]:
        budget, source = memory.memory_budget(
            obj.metadata, app_settings.current().node_memory_budget_bytes
        )
        rss = memory.webserver_counter(obj.metadata, "rss_bytes")
        return budget, source, memory.memory_percent_used(rss, budget)

    @admin.display(description="memory used (RSS / budget)")
    def memory_percent_used(self, obj: Node) -> str:
        return percent(self._memory(obj)[2])

    @admin.display(description="memory watermark")
    def memory_watermark(self, obj: Node) -> str:
        level = memory.memory_watermark(self._memory(obj)[2])
        if level is None:
            return EMPTY
        return coloured(level.value, NODE_WATERMARK_COLOURS[level])

    @admin.display(description="memory budget")
    def memory_budget(self, obj: Node) -> str:
        budget, source, _ = self._memory(obj)
        if budget is None:
            return EMPTY
        return format_html("{} ({})", bytes_cell(budget), source)

    @admin.display(
        description="webserver RSS", ordering="metadata__process_health__webserver__rss_bytes"
    )
    def webserver_rss(self, obj: Node) -> str:
        return bytes_cell(memory.webserver_counter(obj.metadata, "rss_bytes"))

    @admin.display(description="shards loaded")
    def shards_loaded(self, obj: Node) -> str:
        value = memory.webserver_counter(obj.metadata, "shards_loaded")
        return EMPTY if value is None else str(value)

    @admin.display(description="reported memory limit")
    def reported_memory_limit(self, obj: Node) -> str:
        limit = memory.webserver_counter(obj.metadata, "memory_limit_bytes")
        if limit is None:
            return EMPTY
        if memory.reported_memory_limit(obj.metadata) is None:
            return format_html(
                "{} (not used: needs Zoekt {} or later and a finite limit)",
                bytes_cell(limit),
                ".".join(map(str, memory.MEMORY_LIMIT_MIN_VERSION)),
            )
        return bytes_cell(limit)

    @admin.display(description="online", boolean=True, ordering="last_seen_at")
    def online(self, obj: Node) -> bool:
        return obj.is_online()

    @admin.display(description="indices", ordering="annotated_index_count")
    def index_count(self, obj: Node) -> str:
        count = getattr(obj, "annotated_index_count", None)
        if count is None:
            count = obj.indices.count()
        return changelist_link(Index, count, zoekt_node__id__exact=obj.pk)

    unclaimed_storage = bytes_column(
        "unclaimed_storage_bytes",
        description="unclaimed storage",
        ordering="annotated_unclaimed_storage_bytes",
    )

    reserved_storage = bytes_column(
        "reserved_storage_bytes", description="reserved storage (all indices)"
    )

    total_bytes_display = bytes_column("total_bytes", description="total disk")

    used_bytes_display = bytes_column("used_bytes", description="used disk")

    indexed_bytes_display = bytes_column("indexed_bytes", description="indexed (Zoekt files)")

    usable_storage_bytes_display = bytes_column(
        "usable_storage_bytes", description="usable storage"
    )

    @admin.display(description="metadata")
    def metadata_display(self, obj: Node) -> str:
        return pretty_json(obj.metadata)


# ----------------------------------------------------------------------------
# Enabled namespaces and replicas
# ----------------------------------------------------------------------------


def _namespace_target(enabled: EnabledNamespace) -> Target:
    root = enabled.root_namespace
    return Target("namespace", enabled.root_namespace_id, root.path if root else "")


class RolloutFailedFilter(admin.SimpleListFilter):
    title = "rollout failed"
    parameter_name = "rollout_failed"

    def lookups(self, request, model_admin):
        return (("yes", "Yes"), ("no", "No"))

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(last_rollout_failed_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(last_rollout_failed_at__isnull=True)
        return queryset


class EnabledNamespaceForm(forms.ModelForm):
    class Meta:
        model = EnabledNamespace
        fields = ("root_namespace", "search", "number_of_replicas_override")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        override = self.fields.get("number_of_replicas_override")
        if override is not None:
            override.validators.append(MinValueValidator(1))
            override.widget.attrs["min"] = 1
            override.help_text = "Leave blank to use the default number of replicas setting."


@admin.register(NodeShutdown)
class NodeShutdownAdmin(ViewOnlyMixin, admin.ModelAdmin):
    """Node shutdown records, live and past (docs/operations.md); requested and cancelled
    from the nodes' actions, the API or ``manage.py zoekt_node``."""

    list_display = (
        "id",
        "node_name",
        "node_ref",
        "type",
        "status",
        "status_reason",
        "requested_by",
        "requested_at",
        "delay_expires_at",
        "target_node",
        "completed_at",
        "cancelled_by",
        "returned_to_service_by",
    )
    list_filter = ("status", "type")
    list_select_related = ("target_node",)
    search_fields = ("node_name", "requested_by", "reason")
    ordering = ("-requested_at", "-id")


@admin.register(EnabledNamespace)
class EnabledNamespaceAdmin(AuditedSaveMixin, SaveChangedFieldsMixin, admin.ModelAdmin):
    form = EnabledNamespaceForm
    list_display = (
        "id",
        "root_namespace",
        "search",
        "replica_count",
        "number_of_replicas_override",
        "last_rollout_failed_at",
        "created_at",
    )
    list_filter = ("search", RolloutFailedFilter)
    search_fields = ("root_namespace__name", "root_namespace__path", "root_namespace_id__exact")
    list_select_related = ("root_namespace",)
    raw_id_fields = ("root_namespace",)
    fields = (
        "root_namespace",
        "search",
        "number_of_replicas_override",
        "replica_count",
        "last_rollout_failed_at",
        "metadata_display",
        *TIMESTAMPS,
    )
    readonly_fields = (
        "metadata",
        "last_rollout_failed_at",
        "replica_count",
        "metadata_display",
        *TIMESTAMPS,
    )

    def get_queryset(self, request):
        return super().get_queryset(request).with_replica_count()

    def audit_action(self, change: bool) -> str:
        """Enabling a namespace, or changing its ``search`` switch or replica override."""
        return Action.NAMESPACE_UPDATED if change else Action.NAMESPACE_ENABLED

    def audit_target(self, obj: EnabledNamespace) -> Target:
        return _namespace_target(obj)

    def delete_model(self, request, obj):
        with audited(
            admin_actor(request), Action.NAMESPACE_DISABLED, _namespace_target(obj)
        ) as entry:
            entry.details["enabled_namespace_id"] = obj.pk
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset.select_related("root_namespace").order_by("id"):
            self.delete_model(request, obj)

    def get_readonly_fields(self, request, obj=None):
        if obj is not None:
            return ("root_namespace", *self.readonly_fields)
        return self.readonly_fields

    @admin.display(description="replicas", ordering="replica_count")
    def replica_count(self, obj: EnabledNamespace) -> str:
        count = getattr(obj, "replica_count", None)
        if count is None:
            if obj.pk is None:
                return EMPTY
            count = obj.replicas.count()
        return changelist_link(Replica, count, zoekt_enabled_namespace__id__exact=obj.pk)

    @admin.display(description="metadata")
    def metadata_display(self, obj: EnabledNamespace) -> str:
        return pretty_json(obj.metadata)


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "enabled_namespace_link",
        "namespace_id",
        "state",
        "index_count",
        "created_at",
        "updated_at",
    )
    list_filter = ("state",)
    search_fields = ("namespace_id__exact", "zoekt_enabled_namespace_id__exact")
    list_select_related = ("zoekt_enabled_namespace",)
    fields = ("zoekt_enabled_namespace", "namespace", "state", "index_count", *TIMESTAMPS)
    readonly_fields = fields

    def has_add_permission(self, request):
        return False  # provisioning creates replicas

    def has_change_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(annotated_index_count=Count("indices"))

    @admin.display(description="enabled namespace", ordering="zoekt_enabled_namespace_id")
    def enabled_namespace_link(self, obj: Replica) -> str:
        return admin_link(obj.zoekt_enabled_namespace)

    @admin.display(description="indices", ordering="annotated_index_count")
    def index_count(self, obj: Replica) -> str:
        count = getattr(obj, "annotated_index_count", None)
        if count is None:
            count = obj.indices.count()
        return changelist_link(Index, count, zoekt_replica__id__exact=obj.pk)


# ----------------------------------------------------------------------------
# Indices, repositories and tasks: written by the control plane, view-only
# ----------------------------------------------------------------------------


@admin.register(Index)
class IndexAdmin(ViewOnlyMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "namespace_id",
        "node_link",
        "replica_link",
        "state",
        "watermark_level_display",
        "used_bytes",
        "reserved_bytes",
        "used_percent",
        "last_indexed_at",
    )
    list_filter = ("state", "watermark_level", "zoekt_node")
    search_fields = ("namespace_id__exact",)
    list_select_related = ("zoekt_node", "zoekt_replica")
    fields = (
        "namespace_id",
        "zoekt_enabled_namespace",
        "zoekt_replica",
        "zoekt_node",
        "state",
        "watermark_level_display",
        "used_bytes",
        "reserved_bytes",
        "free_bytes",
        "used_percent",
        "used_storage_bytes_updated_at",
        "last_indexed_at",
        "metadata_display",
        *TIMESTAMPS,
    )
    readonly_fields = fields

    @admin.display(description="node", ordering="zoekt_node_id")
    def node_link(self, obj: Index) -> str:
        return admin_link(obj.zoekt_node, obj.zoekt_node.name)

    @admin.display(description="replica", ordering="zoekt_replica_id")
    def replica_link(self, obj: Index) -> str:
        return admin_link(obj.zoekt_replica, obj.zoekt_replica_id)

    @admin.display(description="watermark level", ordering="watermark_level")
    def watermark_level_display(self, obj: Index) -> str:
        level = Index.WatermarkLevel(obj.watermark_level)
        return coloured(level.label, INDEX_WATERMARK_COLOURS[level])

    used_bytes = bytes_column(
        "used_storage_bytes", description="used", ordering="used_storage_bytes"
    )

    reserved_bytes = bytes_column(
        "reserved_storage_bytes", description="reserved", ordering="reserved_storage_bytes"
    )

    free_bytes = bytes_column("free_storage_bytes", description="free (reserved - used)")

    @admin.display(description="used / reserved")
    def used_percent(self, obj: Index) -> str:
        if not obj.reserved_storage_bytes:
            return EMPTY
        return percent(obj.used_storage_bytes / obj.reserved_storage_bytes)

    @admin.display(description="metadata")
    def metadata_display(self, obj: Index) -> str:
        return pretty_json(obj.metadata)


@admin.register(Repository)
class RepositoryAdmin(ViewOnlyMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "project_identifier",
        "index_link",
        "state",
        "size",
        "index_file_count",
        "retries_left",
        "schema_version",
        "indexed_at",
    )
    list_filter = ("state",)
    search_fields = ("project_identifier__exact", "zoekt_index_id__exact")
    list_select_related = ("zoekt_index",)
    show_full_result_count = False
    fields = (
        "zoekt_index",
        "project",
        "project_identifier",
        "state",
        "size",
        "index_file_count",
        "retries_left",
        "schema_version",
        "indexed_at",
        *TIMESTAMPS,
    )
    readonly_fields = fields

    @admin.display(description="index", ordering="zoekt_index_id")
    def index_link(self, obj: Repository) -> str:
        return admin_link(obj.zoekt_index, obj.zoekt_index_id)

    size = bytes_column("size_bytes", description="size", ordering="size_bytes")


@admin.register(HandledTaskFailure)
class HandledTaskFailureAdmin(ViewOnlyMixin, admin.ModelAdmin):
    """Failed tasks whose repository retry was spent, once (docs/reliability.md)."""

    list_display = ("task_id", "handled_at")
    search_fields = ("task_id__exact",)
    ordering = ("-handled_at",)

    def get_search_results(self, request, queryset, search_term):
        if search_term and not search_term.strip().isdigit():
            return queryset.none(), False
        return super().get_search_results(request, queryset, search_term)


@admin.register(Task)
class TaskAdmin(ViewOnlyMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "task_type",
        "state",
        "zoekt_node_id",
        "zoekt_repository_id",
        "project_identifier",
        "perform_at",
        "retries_left",
        "created_at",
    )
    list_filter = ("task_type", "state")
    search_fields = (
        "zoekt_node_id__exact",
        "zoekt_repository_id__exact",
        "project_identifier__exact",
    )
    show_full_result_count = False
    fields = (
        "task_type",
        "state",
        "zoekt_node_id",
        "zoekt_repository_id",
        "project_identifier",
        "partition_id",
        "perform_at",
        "retries_left",
        *TIMESTAMPS,
    )
    readonly_fields = fields


# ----------------------------------------------------------------------------
# Application settings: a single row
# ----------------------------------------------------------------------------


SETTINGS_FIELDSETS = (
    (
        "Indexing",
        {
            "fields": (
                "zoekt_indexing_enabled",
                "zoekt_indexing_paused",
                "zoekt_auto_index_root_namespace",
                "zoekt_cpu_to_tasks_ratio",
                "zoekt_indexing_parallelism",
                "zoekt_indexing_timeout",
                "zoekt_force_reindexing_percentage",
                "zoekt_initial_indexing_limit",
                "zoekt_indexing_admission",
                "zoekt_indexing_temporary_space_factor",
            )
        },
    ),
    (
        "Eviction",
        {
            "fields": (
                "zoekt_node_level_eviction_enabled",
                "zoekt_node_eviction_safeguards",
                "zoekt_eviction_sustain_period",
                "zoekt_eviction_cooldown",
                "zoekt_eviction_order",
                "zoekt_eviction_moves",
                "zoekt_move_max_per_source",
                "zoekt_move_max_per_target",
                "zoekt_move_max_in_cluster",
                "zoekt_memory_pressure_moves",
            )
        },
    ),
    (
        "Rebalancing",
        {
            "fields": (
                "zoekt_rebalance_enabled",
                "zoekt_rebalance_margin",
                "zoekt_rebalance_max_moves",
            )
        },
    ),
    (
        "Search",
        {
            "fields": (
                "zoekt_search_enabled",
                "zoekt_cache_response",
                "zoekt_max_restarts_15m",
            )
        },
    ),
    (
        "Rollout",
        {
            "fields": (
                "zoekt_rollout_batch_size",
                "zoekt_rollout_retry_interval",
                "zoekt_default_number_of_replicas",
            )
        },
    ),
    (
        "Memory",
        {
            "fields": (
                "zoekt_node_memory_budget_bytes",
                "zoekt_memory_ratio",
                "zoekt_memory_auto_calibration",
            )
        },
    ),
    ("Placement", {"fields": ("zoekt_placement_strategy",)}),
    (
        "Limits",
        {
            "fields": (
                "zoekt_maximum_files",
                "zoekt_indexed_file_size_limit",
                "zoekt_trigram_max",
            )
        },
    ),
    (
        "Lost nodes",
        {"fields": ("zoekt_lost_node_threshold", "zoekt_node_restart_delay_seconds")},
    ),
    ("Record", {"fields": ("updated_at",)}),
)
SETTINGS_FIELDS = tuple(
    name for _, options in SETTINGS_FIELDSETS for name in options["fields"] if name != "updated_at"
)


class SizeField(forms.CharField):
    """A byte count typed as the other size settings are, ``32GB`` or ``512MB`` (binary
    units), or as plain bytes; shown back in the largest unit that divides it."""

    def prepare_value(self, value):
        if isinstance(value, int):
            return app_settings.write_size(value)
        return value

    def to_python(self, value):
        text = super().to_python(value).strip()
        if not text:
            return None
        try:
            return app_settings.read_size(text)
        except ValueError:
            raise ValidationError(
                "must be a whole number followed by B, KB, MB or GB (e.g. 32GB), or a number "
                "of bytes; leave it blank to plan by disk alone",
                code="invalid",
            ) from None


class ApplicationSettingForm(forms.ModelForm):
    """Range checks per field, so an error names the field rather than a constraint."""

    zoekt_node_memory_budget_bytes = SizeField(
        label="Memory budget per node",
        required=False,
        help_text="Leave blank to plan by disk alone (the default). When set, every node is "
        "planned against this much webserver memory, or against the memory limit it reports "
        "itself (Zoekt 1.16.0 or later). A size such as 32GB or 512MB (binary units), as the "
        "other size settings take.",
    )

    POSITIVE_INTEGERS = (
        "zoekt_indexing_parallelism",
        "zoekt_rollout_batch_size",
        "zoekt_maximum_files",
        "zoekt_trigram_max",
        "zoekt_default_number_of_replicas",
    )

    class Meta:
        model = ApplicationSetting
        fields = SETTINGS_FIELDS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in self.POSITIVE_INTEGERS:
            self.fields[name].validators.append(MinValueValidator(1))
            self.fields[name].widget.attrs["min"] = 1
        percentage = self.fields["zoekt_force_reindexing_percentage"]
        percentage.validators += [MinValueValidator(0), MaxValueValidator(100)]
        percentage.widget.attrs.update(min=0, max=100)
        budget = self.fields["zoekt_node_memory_budget_bytes"]
        budget.validators.append(MinValueValidator(1))
        budget.widget.attrs["placeholder"] = "e.g. 32GB"

    def clean_zoekt_cpu_to_tasks_ratio(self):
        value = self.cleaned_data["zoekt_cpu_to_tasks_ratio"]
        if value is not None and value <= 0:
            raise ValidationError("must be greater than 0")
        return value

    def clean_zoekt_memory_ratio(self):
        value = self.cleaned_data["zoekt_memory_ratio"]
        if value is not None and value <= 0:
            raise ValidationError("must be greater than 0")
        return value


@admin.register(ApplicationSetting)
class ApplicationSettingAdmin(AuditedSaveMixin, admin.ModelAdmin):
    form = ApplicationSettingForm
    fieldsets = SETTINGS_FIELDSETS
    readonly_fields = ("updated_at",)

    def has_add_permission(self, request):
        return not ApplicationSetting.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False

    def audit_action(self, change: bool) -> str:
        return Action.APPLICATION_SETTINGS_UPDATED

    def audit_target(self, obj: ApplicationSetting) -> Target:
        return Target("application_settings", obj.pk, "application settings")

    def changelist_view(self, request, extra_context=None):
        """There is one row: go straight to it, creating it with the defaults if needed."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        row = app_settings.load_row()
        opts = self.model._meta
        return redirect(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[row.pk]))


@admin.register(AuditEvent)
class AuditEventAdmin(ViewOnlyMixin, admin.ModelAdmin):
    """The audit trail (``zoekt.audit``): append-only, so no add, change or delete here;
    the dashboard's Audit page filters it."""

    list_display = (
        "id",
        "created_at",
        "author_name",
        "via",
        "ip_address",
        "event_name",
        "target_type",
        "target_id",
        "target_details",
        "outcome",
        "reason",
    )
    list_filter = ("via", "outcome", "event_name")
    search_fields = ("author_name", "target_details", "event_name")
    ordering = ("-created_at", "-id")
    actions = None
