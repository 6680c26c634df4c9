"""Celery tasks of scheduling: thin, ids as arguments, one log line each."""

from __future__ import annotations

from celery import shared_task

from zoekt import app_settings
from zoekt.logging import get_logger
from zoekt.models import Project
from zoekt.reasons import Reason
from zoekt.scheduling.indexing import IndexingTaskService

log = get_logger(__name__)


@shared_task(name="zoekt.index_project")
def index_project_task(project_id: int) -> dict:
    """GitLab's IndexingTaskWorker for one ``index_repo`` request (reference 7.1).

    Runs only while indexing is enabled; re-reads the project, since it may
    have gone between the request and now.
    """
    if not app_settings.current().indexing_enabled:
        result = {"project_id": project_id, "skipped": Reason.INDEXING_DISABLED}
        log.info("index_project", **result)
        return result
    project = Project.objects.select_related("namespace").filter(pk=project_id).first()
    if project is None:
        result = {"project_id": project_id, "skipped": Reason.PROJECT_NOT_FOUND}
        log.info("index_project", **result)
        return result
    result = IndexingTaskService(project_id, project=project).execute().as_dict()
    log.info("index_project", **result)
    return result
