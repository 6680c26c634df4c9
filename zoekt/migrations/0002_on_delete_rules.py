"""Give every foreign key GitLab's ON DELETE rule.

Django (5.2) emits foreign keys without an ON DELETE clause and applies its
own ``on_delete`` in Python. GitLab's database does the work itself, so a
row deleted outside the ORM (a bulk delete, a psql session, another service)
cascades, nullifies or is refused exactly as in GitLab.
"""

from django.db import migrations

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

_TEMPLATE = """
DO $$
DECLARE name text;
BEGIN
    SELECT con.conname INTO name
    FROM pg_constraint con
    JOIN pg_attribute att ON att.attrelid = con.conrelid AND att.attnum = ANY (con.conkey)
    WHERE con.contype = 'f' AND con.conrelid = '{table}'::regclass AND att.attname = '{column}';
    IF name IS NOT NULL THEN
        EXECUTE format('ALTER TABLE {table} DROP CONSTRAINT %I', name);
    END IF;
END $$;
ALTER TABLE {table} ADD CONSTRAINT fk_{table}_{column}
    FOREIGN KEY ({column}) REFERENCES {ref} (id) ON DELETE {rule}{deferrable};
"""


def _sql(rule_for):
    return "\n".join(
        _TEMPLATE.format(
            table=table,
            column=column,
            ref=ref,
            rule=rule_for(rule),
            deferrable=" DEFERRABLE INITIALLY DEFERRED",
        )
        for table, column, ref, rule in RULES
    )


class Migration(migrations.Migration):
    dependencies = [("zoekt", "0001_initial")]

    operations = [
        migrations.RunSQL(
            sql=_sql(lambda rule: rule),
            reverse_sql=_sql(lambda _rule: "NO ACTION"),
        ),
    ]
