from django.db import migrations, models

# Frozen as this migration installs it; workflows/engine/sql/functions.py holds the current
# text (RUN_ENDED_NOTIFY; tests/test_schema_functions.py holds the two equal).
RUN_ENDED_NOTIFY_V1 = """
CREATE OR REPLACE FUNCTION waymark_run_ended_notify_v1() RETURNS trigger
LANGUAGE plpgsql AS $function$
BEGIN
    PERFORM pg_notify('waymark_run_ended_' || NEW.id, w.id::text)
       FROM workflows_runwaiter w WHERE w.run_id = NEW.id;
    IF FOUND THEN
        DELETE FROM workflows_runwaiter WHERE run_id = NEW.id;
    END IF;
    RETURN NULL;
END;
$function$;

CREATE TRIGGER run_ended_notify
AFTER UPDATE OF finished_at ON workflows_run
FOR EACH ROW WHEN (OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL)
EXECUTE FUNCTION waymark_run_ended_notify_v1();
"""

DROP_RUN_ENDED_NOTIFY_V1 = """
DROP TRIGGER IF EXISTS run_ended_notify ON workflows_run;
DROP FUNCTION IF EXISTS waymark_run_ended_notify_v1();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0032_deferrals_carry_their_code"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunWaiter",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),  # fmt: skip
                ("run_id", models.BigIntegerField()),
                ("since", models.DateTimeField()),
            ],
            options={
                "indexes": [models.Index(fields=["run_id"], name="run_waiter_run")],
            },
        ),
        # A hint, as workflows_idleworker (0010): no WAL for it, and a crash empties it.
        migrations.RunSQL(
            "ALTER TABLE workflows_runwaiter SET UNLOGGED",
            "ALTER TABLE workflows_runwaiter SET LOGGED",
        ),
        migrations.RunSQL(sql=RUN_ENDED_NOTIFY_V1, reverse_sql=DROP_RUN_ENDED_NOTIFY_V1),
    ]
