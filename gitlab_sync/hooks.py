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

Other events (users, keys, members...) are answered 204 and not stored.
"""

from __future__ import annotations

from datetime import timedelta

import gitlab
from django.conf import settings
from django.db import IntegrityError, connection, transaction

from gitlab_sync import rows, sweep
from gitlab_sync.models import HookEvent
from zoekt import clock
from zoekt.locks import LockKey, advisory_xact_lock
from zoekt.logging import get_logger
from zoekt.models import Namespace

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


def _get(gl: gitlab.Gitlab, path: str, **query) -> dict | None:
    """The entity at ``path``, or None when GitLab says it is not there."""
    try:
        return gl.http_get(path, query_data=query)
    except gitlab.exceptions.GitlabHttpError as exc:
        if exc.response_code == 404:
            return None
        raise


def _ensure_namespace(gl: gitlab.Gitlab, namespace_id: int) -> None:
    """Write a project's parent (and the groups above it) when the catalog lacks them."""
    missing = []
    current = namespace_id
    while current is not None and not Namespace.objects.filter(id=current).exists():
        entity = _get(gl, f"/namespaces/{current}")
        if entity is None:
            return  # gone: the project's write is refused and the event retried
        if entity.get("kind") == "user":
            missing.append(rows.user_namespace_row(entity))
            break
        group = _get(gl, f"/groups/{current}")
        if group is None:
            return
        missing.append(rows.group_row(group))
        current = group.get("parent_id")
    if missing:
        sweep.bulk_upsert(list(reversed(missing)), [], [])


def _refetch_project(gl: gitlab.Gitlab, project_id: int) -> str:
    entity = _get(gl, f"/projects/{project_id}", statistics="true")
    if entity is None:
        return "removed" if _remove_project(project_id) else "absent"
    own, project, sizes = rows.project_rows(entity)
    _ensure_namespace(gl, project["namespace_id"])
    sweep.drop_unknown_forks([project])
    sweep.bulk_upsert([own], [project], [sizes])
    return "written"


def _refetch_group(gl: gitlab.Gitlab, group_id: int) -> str:
    entity = _get(gl, f"/groups/{group_id}")
    if entity is None:
        return "removed" if _remove_namespace(group_id) else "absent"
    if entity.get("parent_id") is not None:
        _ensure_namespace(gl, entity["parent_id"])
    sweep.bulk_upsert([rows.group_row(entity)], [], [])
    return "written"


def _remove_project(project_id: int) -> bool:
    """Delete the project and its project namespace; its repositories are orphaned and the
    deletion pipeline removes them from the nodes."""
    with transaction.atomic():
        advisory_xact_lock(LockKey.CATALOG_UPSERT)
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM projects WHERE id = %s RETURNING project_namespace_id", [project_id]
            )
            row = cursor.fetchone()
            if row is None:
                return False
            if row[0] is not None:
                cursor.execute(
                    "DELETE FROM namespaces WHERE id = %s AND type = 'Project'", [row[0]]
                )
    return True


def _remove_namespace(namespace_id: int) -> bool:
    """Delete a group and, by the database's rules, everything under it."""
    with transaction.atomic():
        advisory_xact_lock(LockKey.CATALOG_UPSERT)
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM namespaces WHERE id = %s AND type <> 'Project'", [namespace_id]
            )
            return cursor.rowcount > 0
