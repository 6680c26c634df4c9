"""Two runs creating tasks at once, in two real transactions: the database refuses the
duplicate pending task that a check-then-insert under READ COMMITTED lets through."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from tests.factories import IndexFactory, RepositoryFactory
from zoekt.models import Repository, Task
from zoekt.scheduling.task_creation import create_bulk_tasks

pytestmark = pytest.mark.django_db(transaction=True)

INDEX = "zoekt_tasks_one_pending_per_repository"


def _duplicates() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM (
                SELECT zoekt_repository_id, task_type FROM zoekt_tasks WHERE state = 0
                GROUP BY 1, 2 HAVING count(*) > 1
            ) AS d
            """
        )
        return cursor.fetchone()[0]


def _race(ids: list[int]) -> dict[str, int]:
    """A creates tasks and holds its transaction open; B starts meanwhile (its NOT EXISTS
    reads before A commits, then it waits on A's row locks); A commits; B goes on."""
    counts: dict[str, int] = {}
    inserted, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def run_a():
        try:
            with transaction.atomic():
                counts["a"] = create_bulk_tasks(Repository.objects.filter(id__in=ids))
                inserted.set()
                release.wait(20)
        except BaseException as error:  # surfaced below
            errors.append(error)
            inserted.set()
        finally:
            connection.close()

    def run_b():
        try:
            inserted.wait(20)
            counts["b"] = create_bulk_tasks(Repository.objects.filter(id__in=ids))
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    a, b = threading.Thread(target=run_a), threading.Thread(target=run_b)
    a.start()
    b.start()
    inserted.wait(20)
    time.sleep(0.5)  # B is inside its statement, waiting on A's locks
    assert b.is_alive(), "B did not wait for A: the interleaving was not produced"
    release.set()
    a.join(30)
    b.join(30)
    assert not errors, errors
    return counts


@pytest.fixture
def repositories():
    index = IndexFactory()
    return [
        RepositoryFactory(zoekt_index=index, state=Repository.State.READY).id for _ in range(40)
    ]


def test_without_the_index_the_interleaving_leaves_duplicates(repositories):
    # The race is real: with the unique index dropped, B writes a second task for each.
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {INDEX}")
    try:
        counts = _race(repositories)
        assert counts == {"a": 40, "b": 40}
        assert _duplicates() == 40
    finally:
        Task.objects.all().delete()
        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE UNIQUE INDEX {INDEX} ON zoekt_tasks "
                "(zoekt_repository_id, task_type, partition_id) WHERE state = 0"
            )


def test_with_the_index_no_interleaving_leaves_two_pending_tasks(repositories):
    counts = _race(repositories)
    assert counts == {"a": 40, "b": 0}
    assert _duplicates() == 0
    assert Task.objects.filter(state=Task.State.PENDING).count() == 40


def test_a_delete_task_beside_a_pending_index_task_is_allowed(repositories):
    create_bulk_tasks(Repository.objects.filter(id__in=repositories[:1]))
    assert (
        create_bulk_tasks(
            Repository.objects.filter(id__in=repositories[:1]), Task.TaskType.DELETE_REPO
        )
        == 1
    )
    assert Task.objects.count() == 2
