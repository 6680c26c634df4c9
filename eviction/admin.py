"""The eviction decisions and the moves in the admin: read-only, newest first."""

from __future__ import annotations

from django.contrib import admin, messages

from eviction.models import EvictionDecision
from zoekt.admin import EnabledNamespaceAdmin, admin_actor, bytes_column
from zoekt.models import Move


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


@admin.register(Move)
class MoveAdmin(admin.ModelAdmin):
    """Moves (``eviction.moves``): live ones hold their namespace's lease."""

    list_display = (
        "id",
        "created_at",
        "trigger",
        "state",
        "reason",
        "namespace_id",
        "source_node",
        "target_node",
        "source_index_ref",
        "replacement_index",
        "moved_size",
        "deadline_at",
        "done_at",
    )
    list_filter = ("state", "trigger", "reason")
    search_fields = ("=namespace_id", "=source_index_ref")
    ordering = ("-id",)
    list_select_related = ("source_node", "target_node")
    moved_size = bytes_column("bytes", "bytes")

    def get_search_results(self, request, queryset, search_term):
        if search_term and not search_term.strip().isdigit():
            return queryset.none(), False
        return super().get_search_results(request, queryset, search_term)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.action(description="Re-split the hottest index with moves (memory-aware)")
def resplit_with_moves(modeladmin, request, queryset):
    """``manage.py zoekt_move --resplit`` for each selected namespace."""
    from eviction import moves, resplit

    for enabled in queryset.order_by("id"):
        root = enabled.root_namespace_id
        try:
            plan = moves.start_resplit(root, actor=admin_actor(request))
        except resplit.ResplitError as error:
            modeladmin.message_user(request, f"Namespace {root}: {error}", messages.ERROR)
            continue
        if plan.move_id is None:
            modeladmin.message_user(
                request, f"Namespace {root}: nothing to re-split, the plan keeps one index."
            )
        else:
            modeladmin.message_user(
                request,
                f"Namespace {root}: re-split started, {len(plan.carves)} carve(s), "
                f"move {plan.move_id} first.",
                messages.SUCCESS,
            )


# The namespaces' admin is the domain's; the action that needs moves is added here.
EnabledNamespaceAdmin.actions = (*(EnabledNamespaceAdmin.actions or ()), resplit_with_moves)
