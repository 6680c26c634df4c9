"""factory-boy factories for the fleet tables, with GitLab-shaped hierarchies."""

from __future__ import annotations

import uuid

import factory

from zoekt import clock
from zoekt.models import (
    EnabledNamespace,
    Index,
    Namespace,
    NamespaceRootStorageStatistics,
    Node,
    Project,
    ProjectStatistics,
    Replica,
    Repository,
    Task,
)

GIB = 1024**3


class GroupFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Namespace
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"group-{n}")
    path = factory.LazyAttribute(lambda o: o.name)
    type = Namespace.Type.GROUP
    parent = None

    @factory.post_generation
    def set_traversal_ids(obj, create, extracted, **kwargs):
        parent_ids = list(obj.parent.traversal_ids) if obj.parent_id else []
        obj.traversal_ids = [*parent_ids, obj.id]
        if create:
            obj.save(update_fields=["traversal_ids"])


class ProjectFactory(factory.django.DjangoModelFactory):
    """A project with its project namespace and, unless ``repository_size=None``, statistics."""

    class Meta:
        model = Project
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"project-{n}")
    path = factory.LazyAttribute(lambda o: o.name)
    namespace = factory.SubFactory(GroupFactory)
    project_namespace = factory.LazyAttribute(
        lambda o: GroupFactory(type=Namespace.Type.PROJECT, parent=o.namespace, name=o.name)
    )

    @factory.post_generation
    def repository_size(obj, create, extracted, **kwargs):
        if create and extracted is not None:
            ProjectStatistics.objects.create(
                project=obj, namespace_id=obj.namespace_id, repository_size=extracted
            )


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    uuid = factory.LazyFunction(uuid.uuid4)
    index_base_url = factory.Sequence(lambda n: f"http://zoekt-{n}:6065")
    search_base_url = factory.LazyAttribute(lambda o: o.index_base_url.replace("6065", "6070"))
    total_bytes = 100 * GIB
    used_bytes = 10 * GIB
    indexed_bytes = 0
    last_seen_at = factory.LazyFunction(clock.now)
    metadata = factory.Sequence(lambda n: {"name": f"zoekt-{n}", "concurrency": 4})


class EnabledNamespaceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = EnabledNamespace

    root_namespace = factory.SubFactory(GroupFactory)


class ReplicaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Replica

    zoekt_enabled_namespace = factory.SubFactory(EnabledNamespaceFactory)
    namespace = factory.LazyAttribute(lambda o: o.zoekt_enabled_namespace.root_namespace)


class IndexFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Index

    zoekt_replica = factory.SubFactory(ReplicaFactory)
    zoekt_enabled_namespace = factory.LazyAttribute(
        lambda o: o.zoekt_replica.zoekt_enabled_namespace
    )
    namespace_id = factory.LazyAttribute(lambda o: o.zoekt_replica.namespace_id)
    zoekt_node = factory.SubFactory(NodeFactory)


class ReplicalessIndexFactory(IndexFactory):
    """An index whose replica is gone (evicted or orphaned); it keeps its enabled namespace."""

    zoekt_replica = None
    zoekt_enabled_namespace = factory.SubFactory(EnabledNamespaceFactory)
    namespace_id = factory.LazyAttribute(lambda o: o.zoekt_enabled_namespace.root_namespace_id)


class RepositoryFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Repository

    zoekt_index = factory.SubFactory(IndexFactory)
    project = factory.SubFactory(ProjectFactory)
    project_identifier = factory.LazyAttribute(lambda o: o.project.id)


class TaskFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Task

    zoekt_node_id = factory.LazyAttribute(lambda o: NodeFactory().id)
    # Distinct by default: the database allows one pending task of a type per repository.
    zoekt_repository_id = factory.Sequence(lambda n: 1_000_000 + n)
    project_identifier = 1
    task_type = Task.TaskType.INDEX_REPO
    perform_at = factory.LazyFunction(clock.now)


class NamespaceRootStorageStatisticsFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = NamespaceRootStorageStatistics

    namespace = factory.SubFactory(GroupFactory)
    repository_size = 3 * GIB
    storage_size = 4 * GIB
