"""State changes behind the operator API: GitLab's admin endpoints.

Every write of ``api/operator_views.py`` is one ``do_*`` call here or, for the
catalog bulk upsert, in ``zoekt.catalog``. A call that cannot proceed raises
``ObjectNotFound`` (GitLab's 404s) or ``Rejected`` (a 400 naming the field at
fault); neither writes anything.
"""

from __future__ import annotations

import dataclasses

from celery.utils import uuid as celery_uuid
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from zoekt import clock, hooks, transitions
from zoekt.audit import Action, Actor, Target, audited, changed_values
from zoekt.logging import get_logger
from zoekt.models import (
    EnabledNamespace,
    Index,
    Namespace,
    Node,
    Project,
    Replica,
    Repository,
    normalize_zone,
    validate_zone,
)
from zoekt.operator_errors import ObjectNotFound, OperatorError, Rejected, error_text

log = get_logger(__name__)

__all__ = ["ObjectNotFound", "OperatorError", "Rejected", "error_text"]


# ----------------------------------------------------------------------------
# Lookups shared by the admin endpoints
# ----------------------------------------------------------------------------


def find_node(node_id: int, field: str = "node_id") -> Node:
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        raise ObjectNotFound(field, f"Zoekt node {node_id} not found.")
    return node


def find_namespace(ref: int | str, field: str = "namespace_id") -> Namespace:
    """A namespace by id, or (as GitLab's ``find_namespace!``) by its full path."""
    text = str(ref).strip()
    namespace = None
    if text.isdigit():
        namespace = Namespace.objects.filter(pk=int(text)).first()
    elif text:
        namespace = _namespace_by_full_path(text)
    if namespace is None:
        raise ObjectNotFound(field, f"Namespace {text} not found.")
    return namespace


def _namespace_by_full_path(full_path: str) -> Namespace | None:
    """Walk ``group/subgroup`` down from a root; paths compare case-insensitively."""
    segments = [s for s in full_path.strip("/").split("/") if s]
    if not segments:
        return None
    match = Q()
    for segment in set(segments):
        match |= Q(path__iexact=segment)
    candidates = list(
        Namespace.objects.filter(match).exclude(type=Namespace.Type.PROJECT).order_by("id")
    )
    parent_id = None
    found = None
    for segment in segments:
        found = next(
            (
                n
                for n in candidates
                if n.parent_id == parent_id and n.path.lower() == segment.lower()
            ),
            None,
        )
        if found is None:
            return None
        parent_id = found.id
    return found


# ----------------------------------------------------------------------------
# GitLab's admin endpoints (reference 3.5)
# ----------------------------------------------------------------------------


def namespace_target(namespace: Namespace | int | str) -> Target:
    """A namespace as the audit trail names it (its id and path, or the reference given)."""
    if isinstance(namespace, Namespace):
        return Target("namespace", namespace.id, namespace.path)
    text = str(namespace)
    return Target(
        "namespace", int(text) if text.isdigit() else None, "" if text.isdigit() else text
    )


def do_set_node_zone(node_id: int, zone: str | None, *, actor: Actor | None = None) -> Node:
    """Set (or clear, with None or an empty string) the node's zone: its failure domain
    (docs/planner.md, "Zones"). ``Rejected`` names ``zone`` for a label that is not one;
    ``ObjectNotFound`` the node. Recorded in the audit trail with the zone before and
    after. A zone changes where new copies go and which moves qualify; nothing placed
    moves because of it by itself (the desired balance never breaks the rule, and never
    moves an index only to mend it)."""
    with audited(actor, Action.NODE_UPDATED, Target("node", node_id)) as entry:
        zone = normalize_zone(zone)
        try:
            validate_zone(zone)
        except ValidationError as error:
            raise Rejected({"zone": list(error.messages)}) from None
        with transaction.atomic():
            node = Node.objects.select_for_update().filter(pk=node_id).first()
            if node is None:
                raise ObjectNotFound("node_id", f"Zoekt node {node_id} not found.")
            before = node.zone
            if before != zone:
                node.zone = zone
                node.save(update_fields=["zone"])
        entry.target = Target("node", node.id, node.name)
        entry.details["changes"] = {"zone": [before, zone]}
    log.info("node_zone_set", node_id=node.id, zone=zone, previous_zone=before)
    return node


def do_enqueue_project_index(project_id: int, *, actor: Actor | None = None) -> str:
    """Queue an ``index_repo`` for the project after commit; returns the Celery job id."""
    with audited(actor, Action.PROJECT_INDEX_REQUESTED, Target("project", project_id)) as entry:
        if not Project.objects.filter(pk=project_id).exists():
            raise ObjectNotFound("project_id", f"Project {project_id} not found.")
        job_id = celery_uuid()
        hooks.index_project_on_commit(project_id, job_id)
        entry.details["job_id"] = job_id
    return job_id


def do_update_number_of_replicas_override(
    namespace_ref: int | str, changes: dict, *, actor: Actor | None = None
) -> EnabledNamespace:
    """``_update_number_of_replicas_override``, recorded in the audit trail."""
    with audited(actor, Action.NAMESPACE_UPDATED, namespace_target(namespace_ref)) as entry:
        enabled, before = _update_number_of_replicas_override(namespace_ref, changes)
        entry.target = namespace_target(enabled.root_namespace)
        entry.details["changes"] = changed_values(
            {"number_of_replicas_override": before},
            {"number_of_replicas_override": enabled.number_of_replicas_override},
        )
    return enabled


def _update_number_of_replicas_override(
    namespace_ref: int | str, changes: dict
) -> tuple[EnabledNamespace, int | None]:
    """Set or clear ``number_of_replicas_override`` on the root's enabled namespace.

    ``changes`` holds ``number_of_replicas_override`` (an int ≥ 1 or None) or
    nothing, in which case nothing changes (GitLab accepts an empty update).
    """
    namespace = find_namespace(namespace_ref, field="id")
    root_id = namespace.root_id
    with transaction.atomic():
        enabled = (
            EnabledNamespace.objects.select_for_update().filter(root_namespace_id=root_id).first()
        )
        if enabled is None:
            raise ObjectNotFound(
                "id",
                f"Zoekt::EnabledNamespace not found: root namespace {root_id} is not enabled.",
            )
        before = enabled.number_of_replicas_override
        if "number_of_replicas_override" in changes:
            enabled.number_of_replicas_override = changes["number_of_replicas_override"]
            enabled.save(update_fields=["number_of_replicas_override"])
    return enabled, before


@dataclasses.dataclass(frozen=True)
class EnableResult:
    enabled_namespace: EnabledNamespace
    zoekt_node_id: int | None
    enabled_namespace_created: bool
    index_id: int | None = None
    index_created: bool = False


def do_enable_namespace(
    node_id: int, namespace_id: int, search: bool | None, *, actor: Actor | None = None
) -> EnableResult:
    """``_enable_namespace``, recorded in the audit trail: ``namespace_enabled`` when it
    enabled the namespace or an index of it, ``namespace_updated`` when it only set
    ``search``, with what changed."""
    with audited(
        actor, Action.NAMESPACE_ENABLED, namespace_target(namespace_id), node_id=node_id
    ) as entry:
        before = (
            EnabledNamespace.objects.filter(root_namespace_id=namespace_id)
            .values_list("search", flat=True)
            .first()
        )
        result = _enable_namespace(node_id, namespace_id, search)
        entry.target = namespace_target(result.enabled_namespace.root_namespace)
        if not (result.enabled_namespace_created or result.index_created):
            entry.action = Action.NAMESPACE_UPDATED
        entry.details.update(
            enabled_namespace_id=result.enabled_namespace.id,
            enabled_namespace_created=result.enabled_namespace_created,
            index_id=result.index_id,
            index_created=result.index_created,
            changes=changed_values({"search": before}, {"search": result.enabled_namespace.search}),
        )
    return result


def _enable_namespace(node_id: int, namespace_id: int, search: bool | None) -> EnableResult:
    """GitLab's ``PUT .../shards/:node_id/indexed_namespaces/:namespace_id``.

    Finds or creates the enabled namespace of a root namespace and sets
    ``search`` when given. With ``node_id`` > 0 it also finds or creates that
    node's index of the namespace, directly in state ``ready`` and attached to
    the namespace's first replica (created when missing). That index bypasses
    the planner: no reservation check, no project range, no repositories; its
    projects are indexed as they are pushed or as an operator asks.
    """
    node = find_node(node_id) if node_id > 0 else None
    namespace = find_namespace(namespace_id)
    if namespace.parent_id is not None:
        raise Rejected(
            {
                "namespace_id": [
                    f"Namespace {namespace.id} is not a root namespace; "
                    f"enable its root {namespace.root_id} instead."
                ]
            }
        )
    with transaction.atomic():
        enabled, created = EnabledNamespace.objects.get_or_create(root_namespace=namespace)
        # Serialise concurrent requests for the same namespace (replica creation).
        enabled = EnabledNamespace.objects.select_for_update().get(pk=enabled.pk)
        if search is not None and enabled.search != search:
            enabled.search = search
            enabled.save(update_fields=["search"])
        if node is None:
            return EnableResult(enabled, None, created)
        index = Index.objects.filter(zoekt_enabled_namespace=enabled, zoekt_node=node).first()
        index_created = False
        if index is None:
            replica = enabled.replicas.order_by("id").first()
            if replica is None:
                replica = Replica.objects.create(
                    zoekt_enabled_namespace=enabled, namespace_id=namespace.id
                )
            index = transitions.create_ready_index(
                zoekt_enabled_namespace=enabled,
                zoekt_node=node,
                zoekt_replica=replica,
                namespace_id=namespace.id,
            )
            index_created = True
    return EnableResult(enabled, node.id, created, index.id, index_created)


def do_disable_namespace(node_id: int, namespace_id: int, *, actor: Actor | None = None) -> dict:
    """``_disable_namespace``, recorded in the audit trail with what it removed."""
    with audited(
        actor, Action.NAMESPACE_DISABLED, namespace_target(namespace_id), node_id=node_id
    ) as entry:
        result = _disable_namespace(node_id, namespace_id)
        entry.details.update(result)
    return result


def _disable_namespace(node_id: int, namespace_id: int) -> dict:
    """GitLab's ``DELETE .../shards/:node_id/indexed_namespaces/:namespace_id``.

    Removes the namespace's indices (on that node, or on every node when
    ``node_id`` is 0), then destroys the enabled namespace (its replicas go
    with it). A namespace that is not enabled is not an error.

    GitLab destroys the index rows. Here ``zoekt_repositories`` refuses that
    (ON DELETE RESTRICT), and for good reason: a node still holds the data of
    every repository row. So an index without repository rows is deleted at
    once, and an index with some is detached from its namespace and replica
    and marked ``pending_deletion``: the deletion pipeline (reference 6.9)
    then sends the nodes ``delete_repo`` tasks and removes the index once
    its last repository is gone. Indices on other nodes (``node_id`` > 0)
    lose their enabled namespace and replica with it, so the orphan check
    sends them down the same path, as in GitLab.
    """
    node = find_node(node_id) if node_id > 0 else None
    namespace = find_namespace(namespace_id)
    now = clock.now()
    with transaction.atomic():
        enabled = (
            EnabledNamespace.objects.select_for_update().filter(root_namespace=namespace).first()
        )
        if enabled is None:
            return {"namespace_id": namespace.id, "enabled_namespace_id": None}
        indices = Index.objects.filter(zoekt_enabled_namespace=enabled)
        if node is not None:
            indices = indices.filter(zoekt_node=node)
        has_repositories = Exists(Repository.objects.filter(zoekt_index=OuterRef("pk")))
        marked = transitions.mark_indices_pending_deletion(
            indices.filter(has_repositories),
            now=now,
            zoekt_enabled_namespace=None,
            zoekt_replica=None,
        )
        _, per_model = indices.exclude(has_repositories).delete()
        deleted = per_model.get(Index._meta.label, 0)
        enabled_id = enabled.id
        enabled.delete()
    return {
        "namespace_id": namespace.id,
        "enabled_namespace_id": enabled_id,
        "indices_deleted": deleted,
        "indices_pending_deletion": marked,
    }
