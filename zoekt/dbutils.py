"""Schema helpers for migrations that Django's schema editor cannot express."""

from __future__ import annotations

_REPLACE_FK = """
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
    FOREIGN KEY ({column}) REFERENCES {ref} (id) ON DELETE {rule} DEFERRABLE INITIALLY DEFERRED;
"""


def on_delete_sql(rules: list[tuple[str, str, str, str]], *, reverse: bool = False) -> str:
    """SQL that rewrites each (table, column, referenced table, rule) foreign key.

    Django (5.2) emits foreign keys without an ON DELETE clause and applies
    its ``on_delete`` in Python; these put the rule in the database, so a row
    deleted outside the ORM behaves as in GitLab. ``reverse`` restores NO ACTION.
    """
    return "\n".join(
        _REPLACE_FK.format(
            table=table, column=column, ref=ref, rule="NO ACTION" if reverse else rule
        )
        for table, column, ref, rule in rules
    )
