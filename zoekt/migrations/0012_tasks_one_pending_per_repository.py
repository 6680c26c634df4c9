from django.db import migrations, models

# Duplicates that races left behind: all but the oldest pending task of a type per
# repository become ``skipped`` (250), so the unique index can be built.
SKIP_DUPLICATES_SQL = """
UPDATE zoekt_tasks AS t SET state = 250, updated_at = now()
FROM (
    SELECT id, partition_id,
           row_number() OVER (
               PARTITION BY zoekt_repository_id, task_type, partition_id ORDER BY id
           ) AS position
    FROM zoekt_tasks
    WHERE state = 0
) AS d
WHERE t.id = d.id AND t.partition_id = d.partition_id AND d.position > 1
"""


class Migration(migrations.Migration):
    dependencies = [
        ("zoekt", "0011_memory_pressure_moves"),
    ]

    operations = [
        migrations.RunSQL(SKIP_DUPLICATES_SQL, migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.UniqueConstraint(
                condition=models.Q(("state", 0)),
                fields=("zoekt_repository_id", "task_type", "partition_id"),
                name="zoekt_tasks_one_pending_per_repository",
            ),
        ),
    ]
