"""System hooks: store what GitLab sent, then refetch the object it names.

A hook payload is not state (it is thin, and says nothing of archiving, forks, storage
or sizes), so each stored event means "refetch this project or group": ``process``
reads it from GitLab's REST API with python-gitlab and writes it through the sweep's
path (the bulk API's serializer and upsert), or removes it when GitLab answers 404.

* ``project_create``, ``project_update``, ``project_rename``, ``project_transfer``,
  ``project_destroy``: ``GET /projects/:id?statistics=true`` (and any parent group the
  catalog lacks) is written; a 404 removes the project (GitLab may keep a project
  marked for deletion, so a destroy is believed only when GitLab no longer has it);
* ``repository_update``: the same, ``ZOEKT_GITLAB_PUSH_DEBOUNCE_SECONDS`` after the
  push (GitLab computes sizes afterwards); pushes meanwhile coalesce into one;
* ``group_create``, ``group_rename``: ``GET /groups/:id`` (and its parents) is written,
  and its descendants' ``traversal_ids`` follow;
* ``group_destroy``: the same, and a 404 removes the group with its subtree.

A removal goes through the catalog's (``catalog.do_remove_catalog_objects``), which
recomputes the root's storage totals in the same transaction; a project GitLab answers
``statistics: null`` for gets no statistics row, and keeps one it already had.

Other events (users, keys, members...) are answered 204 and not stored.
"""

from __future__ import annotations

from datetime import timedelta

import gitlab
from django.conf import settings
from django.db import IntegrityError, transaction

from gitlab_sync import rows, sweep
from gitlab_sync.models import HookEvent
from zoekt import catalog, clock
from zoekt.logging import get_logger

log = get_logger(__name__)

PROJECT_EVENTS = frozenset(
    {"project_create", "project_destroy", "project_rename", "project_transfer", "project_update"}
)
GROUP_EVENTS = frozenset({"group_create", "group_destroy", "group_rename"})
PUSH_EVENTS = frozenset({"repository_update"})
#: Events acted on, and the payload key naming their object.
FOLLOWED = {
    **dict.fromkeys(PROJECT_EVENTS | PUSH_EVENTS, "project_id"),
    **dict.fromkeys(GROUP_EVENTS, "group_id"),
}
#: Events handled in one run of ``process``.
BATCH = 100
#: A failed refetch is tried again after 1, 2, 4, 8 minutes, then given up (the next
#: sweep makes the catalog right anyway).
MAX_ATTEMPTS = 5


def due_at(event_name: str, received_at):
    if event_name in PUSH_EVENTS:
        return received_at + timedelta(seconds=settings.ZOEKT_GITLAB_PUSH_DEBOUNCE_SECONDS)
    return received_at


def store(event_name: str, object_id: int, payload: dict, event_uuid: str | None) -> bool:
    """Keep one event (once per uuid; pushes to a project already waiting coalesce).
    Returns whether it was stored."""
    now = clock.now()
    with transaction.atomic():
        if (
            event_name in PUSH_EVENTS
            and HookEvent.objects.filter(
                state=HookEvent.State.PENDING, event_name=event_name, object_id=object_id
            ).exists()
        ):
            return False
        try:
            with transaction.atomic():
                HookEvent.objects.create(
                    event_uuid=event_uuid,
                    event_name=event_name,
                    object_id=object_id,
                    payload=payload,
                    received_at=now,
                    process_after=due_at(event_name, now),
                )
        except IntegrityError:  # this uuid was received before: a redelivery
            return False
    return True


def process(gl: gitlab.Gitlab | None = None, *, now=None) -> dict:
    """Handle up to ``BATCH`` events that are due, oldest first, each in a transaction of
    its own (so the catalog's lock is held for one refetch, not a batch); safe to run
    twice at once (an event is claimed with SKIP LOCKED)."""
    now = now or clock.now()
    counts: dict[str, int] = {}
    gl = gl or sweep.client(sweep.Config.from_settings())
    seen: set[int] = set()
    for _ in range(BATCH):
        with transaction.atomic():
            event = (
                HookEvent.objects.select_for_update(skip_locked=True)
                .filter(state=HookEvent.State.PENDING, process_after__lte=now)
                .exclude(id__in=seen)
                .order_by("process_after", "id")
                .first()
            )
            if event is None:
                break
            seen.add(event.id)
            try:
                with transaction.atomic():
                    event.outcome = _apply(gl, event)
                event.state = HookEvent.State.DONE
                event.error = ""
            except Exception as exc:  # GitLab down, a refused row: try again later
                event.attempts += 1
                event.error = f"{type(exc).__name__}: {exc}"[:2000]
                if event.attempts >= MAX_ATTEMPTS:
                    event.state = HookEvent.State.FAILED
                else:
                    event.process_after = now + timedelta(minutes=2 ** (event.attempts - 1))
                log.warning("gitlab_hook_failed", event_id=event.id, error=event.error)
            event.processed_at = now
            event.save()
        key = event.outcome if event.state == HookEvent.State.DONE else event.state
        counts[key] = counts.get(key, 0) + 1
    return counts


#: Handled events are kept this long (for the dashboard and the admin), then pruned.
KEEP_HANDLED = timedelta(days=7)


def prune(now=None, *, batch: int = 10_000) -> int:
    """Delete handled events (done or failed) older than ``KEEP_HANDLED``; pending ones
    are never pruned. One bounded statement."""
    cutoff = (now or clock.now()) - KEEP_HANDLED
    ids = list(
        HookEvent.objects.filter(
            state__in=[HookEvent.State.DONE, HookEvent.State.FAILED], processed_at__lt=cutoff
        ).values_list("id", flat=True)[:batch]
    )
    return HookEvent.objects.filter(id__in=ids).delete()[0] if ids else 0


def _apply(gl: gitlab.Gitlab, event: HookEvent) -> str:
    if event.event_name in GROUP_EVENTS:
        return _refetch_group(gl, event.object_id)
    return _refetch_project(gl, event.object_id)


def _ensure_namespace(gl: gitlab.Gitlab, namespace_id: int) -> None:
    """Write a project's parent (and the groups above it) when the catalog lacks them; when
    GitLab no longer has it, nothing (the project's write is refused and the event retried)."""
    missing = sweep.missing_namespace_rows(gl, namespace_id)
    if missing:
        sweep.bulk_upsert(missing, [], [])


def _refetch_project(gl: gitlab.Gitlab, project_id: int) -> str:
    entity = sweep.get_entity(gl, f"/projects/{project_id}", statistics="true")
    if entity is None:
        return "removed" if _remove(project_ids=[project_id]) else "absent"
    own, project, sizes = rows.project_rows(entity)
    _ensure_namespace(gl, project["namespace_id"])
    sweep.drop_unknown_forks([project])
    # No statistics from GitLab (null): no row written, a stored one kept (rows.py).
    sweep.bulk_upsert([own], [project], [] if sizes is None else [sizes])
    return "written"


def _refetch_group(gl: gitlab.Gitlab, group_id: int) -> str:
    entity = sweep.get_entity(gl, f"/groups/{group_id}")
    if entity is None:
        return "removed" if _remove(namespace_ids=[group_id]) else "absent"
    if entity.get("parent_id") is not None:
        _ensure_namespace(gl, entity["parent_id"])
    sweep.bulk_upsert([rows.group_row(entity)], [], [])
    return "written"


def _remove(*, project_ids=(), namespace_ids=()) -> bool:
    """Remove a project (with its project namespace) or a group (with its subtree) through
    the catalog's removal, which refreshes the root's storage totals in the same
    transaction; the repositories left are orphaned for the deletion pipeline. Whether
    anything was there to remove."""
    removed = catalog.do_remove_catalog_objects(
        project_ids=project_ids, namespace_ids=namespace_ids
    )
    return bool(removed["projects"] or removed["namespaces"])
