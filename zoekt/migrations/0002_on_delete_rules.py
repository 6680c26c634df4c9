"""Give every foreign key GitLab's ON DELETE rule.

Django (5.2) emits foreign keys without an ON DELETE clause and applies its
own ``on_delete`` in Python. GitLab's database does the work itself, so a
row deleted outside the ORM (a bulk delete, a psql session, another service)
cascades, nullifies or is refused exactly as in GitLab.
"""

from django.db import migrations

from zoekt.dbutils import on_delete_sql

# (table, column, referenced table, rule)
RULES = [
    ("namespaces", "parent_id", "namespaces", "CASCADE"),
    ("projects", "namespace_id", "namespaces", "CASCADE"),
    ("projects", "project_namespace_id", "namespaces", "CASCADE"),
    ("project_statistics", "project_id", "projects", "CASCADE"),
    ("namespace_root_storage_statistics", "namespace_id", "namespaces", "CASCADE"),
    ("zoekt_enabled_namespaces", "root_namespace_id", "namespaces", "CASCADE"),
    ("zoekt_replicas", "zoekt_enabled_namespace_id", "zoekt_enabled_namespaces", "CASCADE"),
    ("zoekt_replicas", "namespace_id", "namespaces", "CASCADE"),
    ("zoekt_indices", "zoekt_enabled_namespace_id", "zoekt_enabled_namespaces", "SET NULL"),
    ("zoekt_indices", "zoekt_replica_id", "zoekt_replicas", "SET NULL"),
    ("zoekt_indices", "zoekt_node_id", "zoekt_nodes", "CASCADE"),
    ("zoekt_repositories", "zoekt_index_id", "zoekt_indices", "RESTRICT"),
    ("zoekt_repositories", "project_id", "projects", "SET NULL"),
]


class Migration(migrations.Migration):
    dependencies = [("zoekt", "0001_initial")]

    operations = [
        migrations.RunSQL(
            sql=on_delete_sql(RULES),
            reverse_sql=on_delete_sql(RULES, reverse=True),
        ),
    ]
