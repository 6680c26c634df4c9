"""The sweep: walk GitLab's REST API and make the catalog what GitLab holds.

``run(config)`` walks, with python-gitlab, in four phases:

1. **groups**: each top-level group (``GET /groups?top_level_only=true``, offset
   pages of 100) and its ``descendant_groups``, written root first;
2. **users**: the personal namespaces (``GET /namespaces``, kind ``user``);
3. **projects**: every project by keyset pagination (``order_by=id``, 100 a page,
   ``statistics=true``), one page a batch: its project namespace, the project and its
   statistics;
4. **removal**: what the catalog holds and this sweep did not see is deleted, in one
   transaction (``catalog.do_remove_catalog_objects``): projects (their repositories are
   orphaned, and the scheduling's deletion pipeline removes them from the nodes), then
   group and user namespaces (an enabled namespace goes with its root, and its indices
   through the same pipeline); the root storage totals of every root that lost a
   project are recomputed before it commits.

Every write goes through the catalog's one write path, the bulk API's too
(``zoekt.catalog``: its row checks, then ``do_bulk_upsert_catalog``), so
``traversal_ids``, forks, features and the root storage statistics come out as they do
for any writer. Each batch also marks its objects seen by this sweep
(``zoekt_gitlab_seen``), and the sweep's row keeps a cursor (the phase, the last root
group done, the last page of users, the last project id), saved after every batch: an
interrupted sweep is resumed where it stopped. Only a sweep that walked everything
removes anything, and never more than ``max_removal_fraction`` of the catalog's
projects or namespaces (above 100 rows) unless told to: a token that sees less than
all of GitLab must not empty the catalog.

A **delta** sweep (``kind="delta"``, every few minutes from beat) is lighter and removes
nothing: every group compared with the catalog (what is new, of another display name or
path, moved to another parent, archived or of another visibility is written: GitLab fires
no hook for a group transfer, archiving, visibility or a display-name change), then the
projects active since the last complete sweep began (``last_activity_after``, less ten
minutes). A project's parent the catalog lacks (a personal namespace created since the
last full sweep: a delta reads no users) is fetched (``GET /namespaces/:id``) and written
first, in either kind of sweep. A project GitLab answers ``statistics: null`` for gets no
statistics row (``rows.statistics_row``). What a delta cannot see
(deletions, a project changed without activity) the next full sweep, nightly, puts
right. A delta with no complete sweep before it runs as a full sweep. One process sweeps
at a time (an advisory lock); another run in the meantime does nothing.

python-gitlab obeys GitLab's rate limit (it sleeps ``Retry-After`` on a 429) and, as
built here, retries transient errors (500, 502, 503, 504) up to ten times.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import gitlab
from django.db import connection, transaction

from gitlab_sync import rows
from gitlab_sync.models import Seen, Sweep
from zoekt import catalog, clock
from zoekt.locks import LockKey, advisory_xact_lock, try_advisory_session_lock
from zoekt.logging import get_logger
from zoekt.models import Namespace, Project

log = get_logger(__name__)

PER_PAGE = 100
#: Group rows written in one catalog batch (a root and its descendants are cut in these).
GROUP_BATCH = 1_000
#: Skipped objects kept by name in the sweep's record (the count has them all).
SKIPPED_KEPT = 100
#: Removals a sweep always may make, whatever their share of the catalog.
REMOVAL_ALWAYS_ALLOWED = 100
#: A delta sweep reads what changed since the last complete sweep began, less this.
DELTA_OVERLAP = timedelta(minutes=10)


class SweepError(Exception):
    """The sweep cannot go on; its record says why (``state`` failed)."""


@dataclasses.dataclass(frozen=True)
class Config:
    url: str
    token: str
    timeout: float = 30.0
    max_removal_fraction: float = 0.1
    allow_mass_removal: bool = False

    @classmethod
    def from_settings(cls, url: str | None = None, token_file: str | None = None, **kw):
        from django.conf import settings

        url = url or settings.ZOEKT_GITLAB_URL
        token_file = token_file or settings.ZOEKT_GITLAB_TOKEN_FILE
        if not url:
            raise SweepError("no GitLab URL: --url or ZOEKT_GITLAB_URL")
        if not token_file:
            raise SweepError("no token file: --token-file or ZOEKT_GITLAB_TOKEN_FILE")
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise SweepError(f"the token file cannot be read: {exc}") from exc
        if not token:
            raise SweepError(f"the token file {token_file} is empty")
        return cls(
            url=url.rstrip("/"),
            token=token,
            timeout=settings.ZOEKT_GITLAB_TIMEOUT_SECONDS,
            max_removal_fraction=settings.ZOEKT_GITLAB_MAX_REMOVAL_FRACTION,
            **kw,
        )


def client(config: Config) -> gitlab.Gitlab:
    """python-gitlab as the sweep uses it: rate limits obeyed, transient errors retried."""
    return gitlab.Gitlab(
        config.url,
        private_token=config.token,
        timeout=config.timeout,
        retry_transient_errors=True,
        per_page=PER_PAGE,
    )


class _Requests:
    """Counts the HTTP answers python-gitlab receives (retries included), by status."""

    def __init__(self, gl: gitlab.Gitlab) -> None:
        self.by_status: dict[str, int] = {}
        gl.session.hooks.setdefault("response", []).append(self._count)

    def _count(self, response, *args, **kwargs):
        key = str(response.status_code)
        self.by_status[key] = self.by_status.get(key, 0) + 1
        return response

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


def start_or_resume(config: Config, *, restart: bool = False, kind: str = Sweep.Kind.FULL) -> Sweep:
    """The running sweep to resume (of either kind), or a new one of ``kind``; ``restart``
    abandons a running one. A delta with no complete sweep before it is a full sweep."""
    now = clock.now()
    with transaction.atomic():
        running = Sweep.objects.select_for_update().filter(state=Sweep.State.RUNNING).first()
        if running is not None and restart:
            running.state = Sweep.State.FAILED
            running.error = "abandoned by a restarted sweep"
            running.finished_at = now
            running.save()
            running = None
        if running is not None:
            return running
        cursor = {}
        if kind == Sweep.Kind.DELTA:
            last = Sweep.objects.filter(state=Sweep.State.COMPLETE).order_by("-started_at").first()
            if last is None:
                kind = Sweep.Kind.FULL
            else:
                cursor["since"] = (last.started_at - DELTA_OVERLAP).isoformat()
        return Sweep.objects.create(
            kind=kind, gitlab_url=config.url, started_at=now, updated_at=now, cursor=cursor
        )


class SweepBusy(SweepError):
    """Another process is sweeping: this run does nothing."""


def run(
    config: Config,
    *,
    restart: bool = False,
    progress: Callable[[str], None] | None = None,
    gl: gitlab.Gitlab | None = None,
    kind: str = Sweep.Kind.FULL,
) -> Sweep:
    """Walk GitLab and bring the catalog to what it holds; returns the sweep's record.

    One process sweeps at a time (an advisory lock); another raises ``SweepBusy``.
    """
    with try_advisory_session_lock(LockKey.GITLAB_SWEEP) as mine:
        if not mine:
            raise SweepBusy("another process is sweeping GitLab")
        return _run(config, restart=restart, progress=progress, gl=gl, kind=kind)


def _run(config, *, restart, progress, gl, kind) -> Sweep:
    sweep = start_or_resume(config, restart=restart, kind=kind)
    walker = _Walker(sweep, gl or client(config), config, progress or (lambda _: None))
    try:
        walker.run()
    except Exception as exc:
        sweep.state = Sweep.State.FAILED
        sweep.error = f"{type(exc).__name__}: {exc}"
        sweep.finished_at = clock.now()
        walker.save()
        log.error("gitlab_sweep_failed", sweep_id=sweep.id, error=sweep.error)
        if isinstance(exc, SweepError):
            raise
        raise SweepError(sweep.error) from exc
    return sweep


class _Walker:
    def __init__(self, sweep: Sweep, gl: gitlab.Gitlab, config: Config, progress) -> None:
        self.sweep = sweep
        self.gl = gl
        self.config = config
        self.progress = progress
        self.requests = _Requests(gl)
        self.started = time.monotonic()
        counts = sweep.counts
        for key in ("groups", "users", "projects", "skipped"):
            counts.setdefault(key, 0)
        counts.setdefault("skipped_objects", [])
        counts.setdefault("requests", 0)
        self._requests_before = counts["requests"]
        self._answers_before = dict(counts.get("answers", {}))

    # --- the record ---------------------------------------------------------------------

    def save(self) -> None:
        self.sweep.counts["requests"] = self._requests_before + self.requests.total
        answers = dict(self._answers_before)
        for status, n in self.requests.by_status.items():
            answers[status] = answers.get(status, 0) + n
        self.sweep.counts["answers"] = answers
        self.sweep.updated_at = clock.now()
        self.sweep.save()

    def _say(self, phase: str) -> None:
        c = self.sweep.counts
        seconds = max(time.monotonic() - self.started, 1e-9)
        self.progress(
            f"{phase}: {c['groups']:,} groups, {c['users']:,} users, {c['projects']:,} projects "
            f"({c['projects'] / seconds:,.0f}/s), {c['skipped']:,} skipped, "
            f"{self._requests_before + self.requests.total:,} requests"
        )

    def _skip(self, kind: str, object_id: Any, reason: str) -> None:
        self.sweep.counts["skipped"] += 1
        kept = self.sweep.counts["skipped_objects"]
        if len(kept) < SKIPPED_KEPT:
            kept.append({"kind": kind, "id": object_id, "reason": reason})

    # --- the phases ---------------------------------------------------------------------

    def run(self) -> None:
        user = self.gl.http_get("/user")
        if not isinstance(user, dict) or not user.get("is_admin"):
            raise SweepError(
                "the token's user is not an administrator: a sweep must see all of GitLab "
                "(an admin token with read_api)"
            )
        phases = [p.value for p in Sweep.Phase]
        if self.sweep.kind == Sweep.Kind.DELTA:
            phases = [Sweep.Phase.GROUPS, Sweep.Phase.PROJECTS, Sweep.Phase.DONE]
        for phase in phases[phases.index(self.sweep.phase) :]:
            self.sweep.phase = phase
            self.save()
            if phase == Sweep.Phase.DONE:
                break
            delta = "_delta" if self.sweep.kind == Sweep.Kind.DELTA else ""
            getattr(self, f"_{phase}{delta}")()
        self.sweep.state = Sweep.State.COMPLETE
        self.sweep.finished_at = clock.now()
        self.save()
        self._say("complete")
        log.info("gitlab_sweep_complete", sweep_id=self.sweep.id, counts=self.sweep.counts)

    def _groups(self) -> None:
        after = self.sweep.cursor.get("group_root_after", 0)
        roots = self.gl.groups.list(
            iterator=True, top_level_only=True, all_available=True, order_by="id", sort="asc"
        )
        for root in roots:
            if root.id <= after:
                continue
            entities = [root.attributes]
            descendants = self.gl.groups.get(root.id, lazy=True).descendant_groups.list(
                iterator=True, all_available=True
            )
            entities += [g.attributes for g in descendants]
            namespace_rows = []
            for entity in entities:
                try:
                    namespace_rows.append(rows.group_row(entity))
                except rows.Unmappable as exc:
                    self._skip("group", entity.get("id"), str(exc))
            ordered = _parents_first(namespace_rows)
            for start in range(0, len(ordered), GROUP_BATCH):
                self._write_namespaces(ordered[start : start + GROUP_BATCH], "group")
            self.sweep.counts["groups"] += len(ordered)
            self.sweep.cursor["group_root_after"] = root.id
            self.save()
            self._say("groups")

    def _users(self) -> None:
        page = self.sweep.cursor.get("users_page", 1)
        while True:
            items = self.gl.namespaces.list(page=page, per_page=PER_PAGE)
            namespace_rows = []
            for item in items:
                entity = item.attributes
                if entity.get("kind") != "user":
                    continue
                try:
                    namespace_rows.append(rows.user_namespace_row(entity))
                except rows.Unmappable as exc:
                    self._skip("user", entity.get("id"), str(exc))
            self._write_namespaces(namespace_rows, "user")
            self.sweep.counts["users"] += len(namespace_rows)
            page += 1
            self.sweep.cursor["users_page"] = page
            self.save()
            if len(items) < PER_PAGE:
                break
        self._say("users")

    def _projects(self, since: str | None = None) -> None:
        after = self.sweep.cursor.get("project_after", 0)
        # The query goes in ``query_data``: python-gitlab sends it with the first request
        # only and then follows the ``Link`` header, whose ``id_after`` moves on (keyword
        # arguments would be sent again with every page, ``id_after`` with them).
        listing = self.gl.http_list(
            "/projects",
            query_data={
                "pagination": "keyset",
                "order_by": "id",
                "sort": "asc",
                "per_page": PER_PAGE,
                "statistics": "true",
                "id_after": after,
                **({"last_activity_after": since} if since else {}),
            },
            iterator=True,
        )
        batch: list[dict] = []
        for project in listing:
            batch.append(project)
            if len(batch) == PER_PAGE:
                self._write_projects(batch)
                batch = []
        if batch:
            self._write_projects(batch)

    def _groups_delta(self) -> None:
        """Every group, compared with the catalog: what is new or changed (display name,
        path, moved to another parent, archived, visibility) is written. GitLab fires no
        hook for a group transfer, archiving, visibility or a display-name change
        (``group_rename`` is for a path change); this finds them within one delta."""
        listing = self.gl.groups.list(iterator=True, all_available=True, order_by="id", sort="asc")
        stored = {
            nid: (name, path, parent, visibility, archived)
            for nid, name, path, parent, visibility, archived in Namespace.objects.filter(
                type=Namespace.Type.GROUP
            ).values_list("id", "name", "path", "parent_id", "visibility_level", "archived")
        }
        changed = []
        for group in listing:
            try:
                row = rows.group_row(group.attributes)
            except rows.Unmappable as exc:
                self._skip("group", group.attributes.get("id"), str(exc))
                continue
            key = (
                row["name"],
                row["path"],
                row["parent_id"],
                row["visibility_level"],
                row["archived"],
            )
            if stored.get(row["id"]) != key:
                changed.append(row)
        ordered = _parents_first(changed)
        for start in range(0, len(ordered), GROUP_BATCH):
            self._write_namespaces(ordered[start : start + GROUP_BATCH], "group")
        self.sweep.counts["groups"] += len(ordered)
        self.save()
        self._say("groups")

    def _projects_delta(self) -> None:
        """The projects active since the last complete sweep began (``last_activity_after``,
        with an overlap), with their statistics."""
        self._projects(since=self.sweep.cursor["since"])

    def _removal(self) -> None:
        """Remove what the catalog holds and this sweep did not see, in one transaction
        (the catalog's removal, which refreshes the root storage totals it changed)."""
        sweep_id = self.sweep.id
        with transaction.atomic():
            advisory_xact_lock(LockKey.CATALOG_UPSERT)
            projects_gone = _ids(
                "SELECT p.id FROM projects p WHERE NOT EXISTS (SELECT 1 FROM "
                "zoekt_gitlab_seen s WHERE s.kind = %s AND s.object_id = p.id AND s.sweep_id = %s)",
                [Seen.Kind.PROJECT, sweep_id],
            )
            namespaces_gone = _ids(
                "SELECT n.id FROM namespaces n WHERE n.type IN ('Group', 'User') AND NOT "
                "EXISTS (SELECT 1 FROM zoekt_gitlab_seen s WHERE s.kind = %s AND "
                "s.object_id = n.id AND s.sweep_id = %s)",
                [Seen.Kind.NAMESPACE, sweep_id],
            )
            self._check_removal("projects", len(projects_gone), Project.objects.count())
            self._check_removal(
                "namespaces",
                len(namespaces_gone),
                Namespace.objects.exclude(type=Namespace.Type.PROJECT).count(),
            )
            removed = catalog.do_remove_catalog_objects(
                project_ids=projects_gone, namespace_ids=namespaces_gone
            )
            with connection.cursor() as cursor:
                cursor.execute("DELETE FROM zoekt_gitlab_seen WHERE sweep_id <> %s", [sweep_id])
        self.sweep.counts["removed"] = {
            "projects": removed["projects"],
            "namespaces": removed["namespaces"],
            "project_namespaces": removed["project_namespaces"],
        }
        self.save()
        log.info("gitlab_sweep_removed", sweep_id=sweep_id, **self.sweep.counts["removed"])

    def _check_removal(self, what: str, gone: int, total: int) -> None:
        if self.config.allow_mass_removal or gone <= REMOVAL_ALWAYS_ALLOWED:
            return
        if gone > self.config.max_removal_fraction * total:
            raise SweepError(
                f"the sweep would remove {gone:,} of {total:,} {what} "
                f"(over {self.config.max_removal_fraction:.0%}): nothing removed. If GitLab "
                "really lost them, run again with --allow-mass-removal"
            )

    # --- writing ------------------------------------------------------------------------

    def _write_namespaces(self, namespace_rows: list[dict], kind: str) -> None:
        if not namespace_rows:
            return
        written = self._upsert(namespace_rows, [], [], kind)
        _mark_seen(Seen.Kind.NAMESPACE, [r["id"] for r in written[0]], self.sweep.id)

    def _write_projects(self, entities: list[dict]) -> None:
        namespace_rows, project_rows, statistics = [], [], []
        for entity in entities:
            try:
                own, project, sizes = rows.project_rows(entity)
            except rows.Unmappable as exc:
                self._skip("project", entity.get("id"), str(exc))
                continue
            namespace_rows.append(own)
            project_rows.append(project)
            if sizes is not None:  # GitLab has no statistics yet: no row (rows.py)
                statistics.append(sizes)
        self._write_missing_parents(project_rows)
        drop_unknown_forks(project_rows)
        _ns, written, _stats = self._upsert(namespace_rows, project_rows, statistics, "project")
        _mark_seen(Seen.Kind.PROJECT, [r["id"] for r in written], self.sweep.id)
        self.sweep.counts["projects"] += len(written)
        if entities:
            self.sweep.cursor["project_after"] = entities[-1]["id"]
        self.save()
        self._say("projects")

    def _write_missing_parents(self, project_rows: list[dict]) -> None:
        """Write the parents the catalog lacks (``GET /namespaces/:id``, and the groups
        above a group) before their projects: a personal namespace or a group created
        since the groups and users were read, which a delta never reads at all. A parent
        GitLab no longer has is left out; its project is then refused and skipped."""
        wanted = {p["namespace_id"] for p in project_rows}
        known = set(Namespace.objects.filter(id__in=wanted).values_list("id", flat=True))
        for namespace_id in sorted(wanted - known):
            try:
                missing = missing_namespace_rows(self.gl, namespace_id)
            except rows.Unmappable as exc:
                self._skip("namespace", namespace_id, str(exc))
                continue
            for kind in ("group", "user"):
                of_kind = [r for r in missing if r["type"] == kind.capitalize()]
                self._write_namespaces(of_kind, kind)
                self.sweep.counts[f"{kind}s"] += len(of_kind)

    def _upsert(self, namespace_rows, project_rows, statistics, kind: str):
        """Upsert one batch as the bulk API does (the catalog's row checks, then its
        upsert); rows it refuses are skipped and named, and the rest written."""
        for attempt in range(2):
            try:
                bulk_upsert(namespace_rows, project_rows, statistics)
                return namespace_rows, project_rows, statistics
            except catalog.Rejected as exc:
                if attempt:
                    raise SweepError(f"GitLab's rows were refused: {exc.errors}") from exc
                namespace_rows, project_rows, statistics = self._without_refused(
                    exc.errors, namespace_rows, project_rows, statistics, kind
                )
        raise AssertionError("unreachable")

    def _without_refused(self, errors, namespace_rows, project_rows, statistics, kind):
        bad_ns, bad_projects = set(), set()
        for field, messages in errors.items():
            table, _, rest = field.partition("[")
            if not rest:
                continue
            index = int(rest.split("]", 1)[0])
            reason = f"{field}: {messages[0]}"
            if table == "namespaces":
                row = namespace_rows[index]
                bad_ns.add(row["id"])
                if row["type"] != "Project":
                    self._skip(kind, row["id"], reason)
            elif table == "projects":
                bad_projects.add(project_rows[index]["id"])
                self._skip("project", project_rows[index]["id"], reason)
            elif table == "project_statistics":
                bad_projects.add(statistics[index]["project_id"])
                self._skip("project", statistics[index]["project_id"], reason)
        # A project goes with its project namespace, and the other way round.
        bad_projects |= {p["id"] for p in project_rows if p["project_namespace_id"] in bad_ns}
        bad_ns |= {p["project_namespace_id"] for p in project_rows if p["id"] in bad_projects}
        # A group whose parent was refused cannot be written either.
        dropped = True
        while dropped:
            dropped = False
            for row in namespace_rows:
                if row["id"] not in bad_ns and row["parent_id"] in bad_ns:
                    bad_ns.add(row["id"])
                    self._skip(kind, row["id"], f"its parent {row['parent_id']} was refused")
                    dropped = True
        return (
            [r for r in namespace_rows if r["id"] not in bad_ns],
            [r for r in project_rows if r["id"] not in bad_projects],
            [r for r in statistics if r["project_id"] not in bad_projects],
        )


def bulk_upsert(namespace_rows: list[dict], project_rows: list[dict], statistics: list[dict]):
    """``POST /api/v1/catalog/bulk_upsert``'s path without HTTP: the same row checks
    (types, ranges, known repository storages), then the same upsert."""
    return catalog.bulk_upsert(namespace_rows, project_rows, statistics)


def get_entity(gl: gitlab.Gitlab, path: str, **query) -> dict | None:
    """The entity at ``path``, or None when GitLab says it is not there (404)."""
    try:
        return gl.http_get(path, query_data=query)
    except gitlab.exceptions.GitlabHttpError as exc:
        if exc.response_code == 404:
            return None
        raise


def missing_namespace_rows(gl: gitlab.Gitlab, namespace_id: int) -> list[dict]:
    """The rows of a namespace the catalog lacks and of the groups above it that it lacks
    too, parents first: ``GET /namespaces/:id``, then ``GET /groups/:id`` up the chain.
    Empty when the catalog has it, or when GitLab no longer does (a write of its project
    is then refused). ``rows.Unmappable`` when GitLab's entity cannot be held."""
    missing: list[dict] = []
    current = namespace_id
    while current is not None and not Namespace.objects.filter(id=current).exists():
        entity = get_entity(gl, f"/namespaces/{current}")
        if entity is None:
            return []
        if entity.get("kind") == "user":
            missing.append(rows.user_namespace_row(entity))
            break
        group = get_entity(gl, f"/groups/{current}")
        if group is None:
            return []
        missing.append(rows.group_row(group))
        current = group.get("parent_id")
    return list(reversed(missing))


def _parents_first(namespace_rows: list[dict]) -> list[dict]:
    """Rows ordered so that a parent in the list comes before its children."""
    by_id = {r["id"]: r for r in namespace_rows}
    depth: dict[int, int] = {}

    def depth_of(nid: int, seen: frozenset = frozenset()) -> int:
        if nid in depth:
            return depth[nid]
        parent = by_id[nid]["parent_id"]
        value = 0 if parent not in by_id or nid in seen else 1 + depth_of(parent, seen | {nid})
        depth[nid] = value
        return value

    return sorted(namespace_rows, key=lambda r: (depth_of(r["id"]), r["id"]))


def drop_unknown_forks(project_rows: list[dict]) -> None:
    """A fork whose source is neither in the batch nor the catalog keeps no fork link
    (GitLab shows the source only to who can read it; a deleted source is gone)."""
    sources = {p["forked_from_project_id"] for p in project_rows} - {None}
    if not sources:
        return
    known = set(Project.objects.filter(id__in=sources).values_list("id", flat=True))
    known |= {p["id"] for p in project_rows}
    for row in project_rows:
        if row["forked_from_project_id"] not in known:
            row["forked_from_project_id"] = None


def _mark_seen(kind: int, ids: Iterable[int], sweep_id: int) -> None:
    ids = list(ids)
    if not ids:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO zoekt_gitlab_seen (kind, object_id, sweep_id) "
            "SELECT %s, unnest(%s::bigint[]), %s "
            "ON CONFLICT (kind, object_id) DO UPDATE SET sweep_id = EXCLUDED.sweep_id",
            [kind, ids, sweep_id],
        )


def _ids(sql: str, params: list) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]
