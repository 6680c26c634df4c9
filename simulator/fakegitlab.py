"""A fake GitLab at the HTTP edge: the REST endpoints the control plane reads, in GitLab's shapes.

GitLab cannot run here, so the sweep (``gitlab_sync``) is tested and benchmarked against
this WSGI application, served over real HTTP on a loopback port. It answers as GitLab's
REST API is documented to (``../shared/reference/gitlab-integration.md``):

* ``GET /api/v4/user``: the token's user (``is_admin``);
* ``GET /api/v4/groups`` (``top_level_only``, offset pagination), ``GET
  /api/v4/groups/:id`` and ``GET /api/v4/groups/:id/descendant_groups``;
* ``GET /api/v4/namespaces``: user and group namespaces (``kind``), offset pagination;
  ``GET /api/v4/namespaces/:id``;
* ``GET /api/v4/projects`` with ``pagination=keyset&order_by=id&sort=asc`` (the next page
  in the ``Link`` header with ``id_after``; none on the last page), ``statistics=true``
  (``"statistics": null`` for a project without statistics yet), ``last_activity_after``;
  ``GET /api/v4/projects/:id``.

Offset pages carry ``X-Page``, ``X-Per-Page``, ``X-Next-Page`` and a ``Link`` header;
``per_page`` is capped at 100. A request without the ``PRIVATE-TOKEN`` the fake was
made with is a 401. Faults, for the client's retries: every ``rate_limit_every``-th
request is a 429 with ``Retry-After``, every ``error_every``-th a 502.

The state is plain data the tests change as GitLab's users would (create, rename,
transfer, archive, delete); ``requests`` counts what was asked, and
``root_storage_statistics()`` gives the root totals GitLab would hold for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from socketserver import ThreadingMixIn
from urllib.parse import parse_qs, urlencode
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

MAX_PER_PAGE = 100


@dataclasses.dataclass
class Group:
    id: int
    path: str
    parent_id: int | None = None
    name: str | None = None
    visibility: str = "public"
    archived: bool = False


@dataclasses.dataclass
class User:
    id: int  # the user's personal namespace id
    username: str


@dataclasses.dataclass
class Project:
    id: int
    path: str
    namespace_id: int
    name: str | None = None
    visibility: str = "public"
    archived: bool = False
    repository_access_level: str = "enabled"
    forked_from_id: int | None = None
    repository_storage: str = "default"
    repository_size: int = 1024 * 1024
    storage_size: int | None = None
    #: False for a project GitLab has no statistics for yet (computed asynchronously):
    #: ``statistics=true`` then answers ``"statistics": null``.
    has_statistics: bool = True
    #: GitLab's ``last_activity_at`` (ISO 8601), which ``last_activity_after`` filters on.
    last_activity_at: str = "2026-01-01T00:00:00+00:00"


class FakeGitLab:
    def __init__(
        self,
        token: str = "admin-token",
        *,
        admin: bool = True,
        rate_limit_every: int = 0,
        error_every: int = 0,
        retry_after: int = 0,
    ) -> None:
        self.token = token
        self.admin = admin
        self.rate_limit_every = rate_limit_every
        self.error_every = error_every
        self.retry_after = retry_after
        self.groups: dict[int, Group] = {}
        self.users: dict[int, User] = {}
        self.projects: dict[int, Project] = {}
        self.requests: Counter = Counter()
        self.answered: Counter = Counter()
        self._count = 0
        self._lock = threading.Lock()

    # --- the state, as GitLab's users change it ---------------------------------------------

    def add_group(self, id: int, path: str, parent_id: int | None = None, **kw) -> Group:
        self.groups[id] = Group(id, path, parent_id, **kw)
        return self.groups[id]

    def add_user(self, id: int, username: str) -> User:
        self.users[id] = User(id, username)
        return self.users[id]

    def add_project(self, id: int, path: str, namespace_id: int, **kw) -> Project:
        self.projects[id] = Project(id, path, namespace_id, **kw)
        return self.projects[id]

    def delete_group(self, group_id: int) -> None:
        """A group and everything under it."""
        doomed = {group_id}
        changed = True
        while changed:
            more = {g.id for g in self.groups.values() if g.parent_id in doomed} - doomed
            doomed |= more
            changed = bool(more)
        for gid in doomed:
            self.groups.pop(gid, None)
        for pid in [p.id for p in self.projects.values() if p.namespace_id in doomed]:
            del self.projects[pid]

    # --- paths -------------------------------------------------------------------------------

    def _namespace_path(self, namespace_id: int) -> tuple[str, str, int | None]:
        """(full_path, kind, parent_id) of a group or user namespace."""
        if namespace_id in self.users:
            return self.users[namespace_id].username, "user", None
        parts, node = [], self.groups[namespace_id]
        while True:
            parts.append(node.path)
            if node.parent_id is None:
                break
            node = self.groups[node.parent_id]
        group = self.groups[namespace_id]
        return "/".join(reversed(parts)), "group", group.parent_id

    def group_entity(self, group: Group, *, statistics: bool = False) -> dict:
        full_path, _, _ = self._namespace_path(group.id)
        entity = {
            "id": group.id,
            "name": group.name or group.path,
            "path": group.path,
            "full_path": full_path,
            "full_name": full_path,
            "parent_id": group.parent_id,
            "visibility": group.visibility,
            "archived": group.archived,
            "web_url": f"http://gitlab.example.com/groups/{full_path}",
        }
        if statistics:
            entity["statistics"] = {"repository_size": 0, "storage_size": 0}
        return entity

    def namespace_entity(self, namespace_id: int) -> dict:
        full_path, kind, parent_id = self._namespace_path(namespace_id)
        path = full_path.rsplit("/", 1)[-1]
        group = self.groups.get(namespace_id)
        return {
            "id": namespace_id,
            "name": (group.name if group is not None else None) or path,
            "path": path,
            "kind": kind,
            "full_path": full_path,
            "parent_id": parent_id,
        }

    def project_entity(self, project: Project, *, statistics: bool = False) -> dict:
        namespace = self.namespace_entity(project.namespace_id)
        entity = {
            "id": project.id,
            "name": project.name or project.path,
            "path": project.path,
            "path_with_namespace": f"{namespace['full_path']}/{project.path}",
            "namespace": namespace,
            "archived": project.archived,
            "visibility": project.visibility,
            "empty_repo": False,
            "repository_access_level": project.repository_access_level,
            "repository_storage": project.repository_storage,
            "last_activity_at": project.last_activity_at,
        }
        if project.forked_from_id is not None and project.forked_from_id in self.projects:
            entity["forked_from_project"] = {"id": project.forked_from_id}
        if statistics and not project.has_statistics:
            entity["statistics"] = None
        elif statistics:
            entity["statistics"] = {
                "commit_count": 1,
                "repository_size": project.repository_size,
                "storage_size": self.storage_size_of(project),
                "wiki_size": 0,
                "lfs_objects_size": 0,
            }
        return entity

    @staticmethod
    def storage_size_of(project: Project) -> int:
        """The ``storage_size`` GitLab reports for ``project``."""
        return project.storage_size or project.repository_size

    def root_of(self, namespace_id: int) -> int:
        """The top-level group or the personal namespace ``namespace_id`` is under."""
        while namespace_id in self.groups and self.groups[namespace_id].parent_id is not None:
            namespace_id = self.groups[namespace_id].parent_id
        return namespace_id

    def root_storage_statistics(self) -> dict[int, tuple[int, int]]:
        """Each root's ``(repository_size, storage_size)``: the sums over the projects below
        it that have statistics (GitLab's ``root_storage_statistics``, these two columns)."""
        roots = [g.id for g in self.groups.values() if g.parent_id is None] + list(self.users)
        totals = dict.fromkeys(roots, (0, 0))
        for project in self.projects.values():
            if not project.has_statistics:
                continue
            root = self.root_of(project.namespace_id)
            repository, storage = totals[root]
            totals[root] = (
                repository + project.repository_size,
                storage + self.storage_size_of(project),
            )
        return totals

    # --- WSGI --------------------------------------------------------------------------------

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        query = {k: v[-1] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        route = self._route_name(path)
        with self._lock:
            self._count += 1
            count = self._count
            self.requests[route] += 1
        status, headers, body = self._answer(environ, path, query, count)
        with self._lock:
            self.answered[(route, int(status.split()[0]))] += 1
        data = json.dumps(body).encode()
        headers = [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(data))),
            *headers,
        ]
        start_response(status, headers)
        return [data]

    @staticmethod
    def _route_name(path: str) -> str:
        parts = [p for p in path.removeprefix("/api/v4/").split("/") if p]
        return "/".join(":id" if p.isdigit() else p for p in parts)

    def _answer(self, environ, path: str, query: dict, count: int):
        if environ.get("HTTP_PRIVATE_TOKEN") != self.token:
            return "401 Unauthorized", [], {"message": "401 Unauthorized"}
        if self.rate_limit_every and count % self.rate_limit_every == 0:
            return (
                "429 Too Many Requests",
                [("Retry-After", str(self.retry_after))],
                {"message": "429 Too Many Requests"},
            )
        if self.error_every and count % self.error_every == 0:
            return "502 Bad Gateway", [], {"message": "502 Bad Gateway"}
        if environ.get("REQUEST_METHOD", "GET") != "GET":
            return "405 Method Not Allowed", [], {"message": "405 Method Not Allowed"}
        parts = [p for p in path.removeprefix("/api/v4/").split("/") if p]
        # Grape's Boolean: "true", "True" and "1" are true.
        statistics = query.get("statistics", "").lower() in {"true", "1"}
        with self._lock:
            if parts == ["user"]:
                return "200 OK", [], {"id": 1, "username": "root", "is_admin": self.admin}
            if parts == ["groups"]:
                groups = sorted(self.groups.values(), key=lambda g: g.id)
                if query.get("top_level_only", "").lower() in {"true", "1"}:
                    groups = [g for g in groups if g.parent_id is None]
                items = [self.group_entity(g, statistics=statistics) for g in groups]
                return self._offset(environ, path, query, items)
            if len(parts) == 2 and parts[0] == "groups" and parts[1].isdigit():
                group = self.groups.get(int(parts[1]))
                if group is None:
                    return "404 Not Found", [], {"message": "404 Group Not Found"}
                return "200 OK", [], self.group_entity(group, statistics=statistics)
            if len(parts) == 3 and parts[0] == "groups" and parts[2] == "descendant_groups":
                root = int(parts[1]) if parts[1].isdigit() else -1
                if root not in self.groups:
                    return "404 Not Found", [], {"message": "404 Group Not Found"}
                below = self._descendants(root)
                items = [self.group_entity(self.groups[g]) for g in sorted(below)]
                return self._offset(environ, path, query, items)
            if len(parts) == 2 and parts[0] == "namespaces" and parts[1].isdigit():
                nid = int(parts[1])
                if nid not in self.groups and nid not in self.users:
                    return "404 Not Found", [], {"message": "404 Namespace Not Found"}
                return "200 OK", [], self.namespace_entity(nid)
            if parts == ["namespaces"]:
                ids = sorted([*self.users, *self.groups])
                return self._offset(environ, path, query, [self.namespace_entity(i) for i in ids])
            if parts == ["projects"]:
                return self._projects(environ, path, query, statistics)
            if len(parts) == 2 and parts[0] == "projects" and parts[1].isdigit():
                project = self.projects.get(int(parts[1]))
                if project is None:
                    return "404 Not Found", [], {"message": "404 Project Not Found"}
                return "200 OK", [], self.project_entity(project, statistics=statistics)
        return "404 Not Found", [], {"message": "404 Not Found"}

    def _descendants(self, root: int) -> set[int]:
        found: set[int] = set()
        frontier = {root}
        while frontier:
            frontier = {g.id for g in self.groups.values() if g.parent_id in frontier} - found
            found |= frontier
        return found

    @staticmethod
    def _per_page(query: dict) -> int:
        try:
            return max(1, min(MAX_PER_PAGE, int(query.get("per_page", 20))))
        except ValueError:
            return 20

    def _url(self, environ, path: str, query: dict) -> str:
        host = environ.get("HTTP_HOST") or f"{environ['SERVER_NAME']}:{environ['SERVER_PORT']}"
        return f"http://{host}{path}?{urlencode(query)}"

    def _offset(self, environ, path: str, query: dict, items: list[dict]):
        per_page = self._per_page(query)
        try:
            page = max(1, int(query.get("page", 1)))
        except ValueError:
            page = 1
        chunk = items[(page - 1) * per_page : page * per_page]
        headers = [("X-Page", str(page)), ("X-Per-Page", str(per_page))]
        if page * per_page < len(items):
            headers.append(("X-Next-Page", str(page + 1)))
            link = self._url(environ, path, {**query, "page": page + 1, "per_page": per_page})
            headers.append(("Link", f'<{link}>; rel="next"'))
        else:
            headers.append(("X-Next-Page", ""))
        headers += [("X-Total", str(len(items)))]
        return "200 OK", headers, chunk

    def _projects(self, environ, path: str, query: dict, statistics: bool):
        per_page = self._per_page(query)
        projects = sorted(self.projects.values(), key=lambda p: p.id)
        if query.get("last_activity_after"):
            since = datetime.fromisoformat(query["last_activity_after"].replace("Z", "+00:00"))
            projects = [p for p in projects if datetime.fromisoformat(p.last_activity_at) > since]
        if query.get("pagination") != "keyset":
            items = [self.project_entity(p, statistics=statistics) for p in projects]
            return self._offset(environ, path, query, items)
        if query.get("order_by", "id") != "id":
            return "400 Bad Request", [], {"error": "order_by is invalid for keyset"}
        after = int(query.get("id_after", 0) or 0)
        chunk = [p for p in projects if p.id > after][: per_page + 1]
        page, more = chunk[:per_page], len(chunk) > per_page
        headers = [("X-Per-Page", str(per_page))]
        if more:
            link = self._url(environ, path, {**query, "id_after": page[-1].id})
            headers.append(("Link", f'<{link}>; rel="next"'))
        return "200 OK", headers, [self.project_entity(p, statistics=statistics) for p in page]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve(app: FakeGitLab) -> Iterator[str]:
    """Serve ``app`` on a loopback port in a thread; yields its base URL."""
    server = make_server(
        "127.0.0.1", 0, app, server_class=_ThreadingServer, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="fake-gitlab")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
