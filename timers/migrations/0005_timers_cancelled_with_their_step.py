"""A timer is cancelled with its step (``cancelled_at``), by a trigger on the engine's steps
(timers_cancel_with_step_v1): a cancelled run's timers no longer fire at their time.
Pending now means neither fired nor cancelled, so both partial indexes are rebuilt with it.
A timer left pending by a step cancelled before this migration is recorded as cancelled
when it comes due (sql.MARK_FIRED).

The trigger's SQL below is frozen: it is what this migration ran, whatever its current text
is now (timers/sql.py, checked against the migrated database by
tests/test_schema_functions.py). A change to it is a new version and a migration."""

from django.db import migrations, models

CANCEL_WITH_STEP_V1 = """
CREATE OR REPLACE FUNCTION timers_cancel_with_step_v1() RETURNS trigger
LANGUAGE plpgsql AS $function$
BEGIN
    UPDATE timers_timer SET cancelled_at = clock_timestamp()
     WHERE id IN (SELECT t.id FROM timers_timer t
                   WHERE t.run_id = NEW.run_id AND t.step_id = NEW.step_id
                     AND t.iteration = NEW.iteration
                     AND t.fired_at IS NULL AND t.cancelled_at IS NULL
                     FOR UPDATE SKIP LOCKED);
    RETURN NULL;
END
$function$;

CREATE TRIGGER timers_cancel_with_step
 AFTER UPDATE OF status ON workflows_step
 FOR EACH ROW WHEN (OLD.status = 'waiting' AND NEW.status = 'cancelled')
 EXECUTE FUNCTION timers_cancel_with_step_v1();
"""

DROP_CANCEL_WITH_STEP_V1 = """
DROP TRIGGER IF EXISTS timers_cancel_with_step ON workflows_step;
DROP FUNCTION IF EXISTS timers_cancel_with_step_v1();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('timers', '0004_next_due_index_for_all_orgs'),
        ('workflows', '0018_settle_hops_set_based'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='timer',
            name='timer_pending',
        ),
        migrations.RemoveIndex(
            model_name='timer',
            name='timer_next_due',
        ),
        migrations.AddField(
            model_name='timer',
            name='cancelled_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='timer',
            index=models.Index(condition=models.Q(('cancelled_at__isnull', True), ('fired_at__isnull', True)), fields=['org', 'due_at'], name='timer_pending'),
        ),
        migrations.AddIndex(
            model_name='timer',
            index=models.Index(condition=models.Q(('cancelled_at__isnull', True), ('fired_at__isnull', True), ('org_id__gt', 0)), fields=['due_at'], name='timer_next_due'),
        ),
        migrations.RunSQL(sql=CANCEL_WITH_STEP_V1, reverse_sql=DROP_CANCEL_WITH_STEP_V1),
    ]
