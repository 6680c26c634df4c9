import pytest

from tests.factories import NodeFactory, RepositoryFactory, TaskFactory
from zoekt.models import Node


@pytest.mark.django_db
def test_factories_build_a_consistent_hierarchy():
    repo = RepositoryFactory()
    index = repo.zoekt_index
    assert index.namespace_id == index.zoekt_replica.namespace_id
    assert repo.project.project_namespace.traversal_ids[0] == repo.project.namespace_id
    task = TaskFactory()
    assert task.id is not None and task.partition_id == 1
    node = Node.objects.with_unclaimed_storage_bytes().get(pk=index.zoekt_node_id)
    assert node.annotated_unclaimed_storage_bytes == node.usable_storage_bytes - 10 * 1024**3
    assert NodeFactory().usable_storage_bytes == 90 * 1024**3
