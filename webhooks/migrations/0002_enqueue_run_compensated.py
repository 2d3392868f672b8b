"""The trigger that queues deliveries also lets through `run.compensated` (a saga's end).

Only the trigger's WHEN clause changes (webhooks_enqueue_v1 itself is unchanged): frozen
here, as this migration ran it (webhooks/sql.py holds the current text)."""

from django.db import migrations

TRIGGER_V2 = """
DROP TRIGGER IF EXISTS webhooks_enqueue ON workflows_runevent;
CREATE TRIGGER webhooks_enqueue
 AFTER INSERT ON workflows_runevent
 FOR EACH ROW WHEN (
     NEW.kind IN ('run.started', 'run.succeeded', 'run.failed', 'run.cancelled',
                  'run.compensated', 'step.failed', 'effect.needs_review')
     OR (NEW.kind = 'step.waiting' AND (NEW.detail ? 'approval' OR NEW.detail ? 'task')))
 EXECUTE FUNCTION webhooks_enqueue_v1();
"""

TRIGGER_V1 = """
DROP TRIGGER IF EXISTS webhooks_enqueue ON workflows_runevent;
CREATE TRIGGER webhooks_enqueue
 AFTER INSERT ON workflows_runevent
 FOR EACH ROW WHEN (
     NEW.kind IN ('run.started', 'run.succeeded', 'run.failed', 'run.cancelled', 'step.failed',
                  'effect.needs_review')
     OR (NEW.kind = 'step.waiting' AND (NEW.detail ? 'approval' OR NEW.detail ? 'task')))
 EXECUTE FUNCTION webhooks_enqueue_v1();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0001_subscriptions_and_deliveries"),
    ]

    operations = [
        migrations.RunSQL(sql=TRIGGER_V2, reverse_sql=TRIGGER_V1),
    ]
