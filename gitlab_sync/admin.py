"""The sweeps in the admin: read-only, newest first (what each wrote, skipped and removed)."""

from __future__ import annotations

from django.contrib import admin

from gitlab_sync.models import HookEvent, Sweep


@admin.register(Sweep)
class SweepAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "kind",
        "state",
        "phase",
        "started_at",
        "finished_at",
        "projects_written",
        "skipped",
        "removed_projects",
        "requests",
        "error",
    )
    list_filter = ("state", "kind")
    search_fields = ("error", "gitlab_url")
    ordering = ("-id",)
    readonly_fields = [f.name for f in Sweep._meta.fields]

    @admin.display(description="projects written")
    def projects_written(self, obj: Sweep):
        return obj.counts.get("projects", 0)

    @admin.display(description="skipped")
    def skipped(self, obj: Sweep):
        return obj.counts.get("skipped", 0)

    @admin.display(description="projects removed")
    def removed_projects(self, obj: Sweep):
        return (obj.counts.get("removed") or {}).get("projects", 0)

    @admin.display(description="requests")
    def requests(self, obj: Sweep):
        return obj.counts.get("requests", 0)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(HookEvent)
class HookEventAdmin(admin.ModelAdmin):
    """The system hooks received: pending ones are the backlog, failed ones gave up."""

    list_display = (
        "id",
        "received_at",
        "event_name",
        "object_id",
        "state",
        "outcome",
        "attempts",
        "process_after",
        "processed_at",
        "error",
    )
    list_filter = ("state", "event_name", "outcome")
    search_fields = ("event_uuid", "error")
    ordering = ("-id",)
    readonly_fields = [f.name for f in HookEvent._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
