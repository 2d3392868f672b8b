"""Retention deletes finished runs with raw SQL (workflows knows nothing of effects): the
database deletes their effects with them. A migration of its own because Django adds the
foreign key at the end of the migration that creates the table."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("effects", "0001_ledger_connections")]

    operations = [
        migrations.RunSQL(
            sql="""
DO $$
DECLARE fk text;
BEGIN
    SELECT conname INTO fk FROM pg_constraint
     WHERE conrelid = 'effects_effect'::regclass AND contype = 'f'
       AND confrelid = 'workflows_run'::regclass;
    EXECUTE format('ALTER TABLE effects_effect DROP CONSTRAINT %I', fk);
    ALTER TABLE effects_effect ADD CONSTRAINT effects_effect_run_cascade
        FOREIGN KEY (run_id) REFERENCES workflows_run (id)
        ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;
END $$;
""",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
