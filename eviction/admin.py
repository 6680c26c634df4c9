"""The eviction decisions in the admin: read-only, newest first."""

from __future__ import annotations

from django.contrib import admin

from eviction.models import EvictionDecision
from zoekt.admin import bytes_column


@admin.register(EvictionDecision)
class EvictionDecisionAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "created_at",
        "node_name",
        "trigger",
        "mode",
        "reason",
        "applied_at",
        "namespaces_affected",
        "chosen_size",
        "used_size",
        "projected_size",
        "repeats",
        "cooldown_end_reason",
    )
    list_filter = ("trigger", "mode", "reason", ("applied_at", admin.EmptyFieldListFilter))
    search_fields = ("node_name",)
    ordering = ("-id",)
    chosen_size = bytes_column("chosen_bytes", "evicted (used bytes)")
    used_size = bytes_column("used_bytes", "node used", "used_bytes")
    projected_size = bytes_column("projected_used_bytes", "projected after")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
