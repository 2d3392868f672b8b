"""Retention deletes finished runs with raw SQL (workflows knows nothing of timers): the
database deletes their timers with them. A migration of its own because Django adds the
foreign key at the end of the migration that creates the table."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("timers", "0001_timers_and_sweep")]

    operations = [
        migrations.RunSQL(
            sql="""
DO $$
DECLARE fk text;
BEGIN
    SELECT conname INTO fk FROM pg_constraint
     WHERE conrelid = 'timers_timer'::regclass AND contype = 'f'
       AND confrelid = 'workflows_run'::regclass;
    EXECUTE format('ALTER TABLE timers_timer DROP CONSTRAINT %I', fk);
    ALTER TABLE timers_timer ADD CONSTRAINT timers_timer_run_cascade
        FOREIGN KEY (run_id) REFERENCES workflows_run (id)
        ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;
END $$;
""",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
