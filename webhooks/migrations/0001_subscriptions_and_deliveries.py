"""Webhook subscriptions and their deliveries (webhooks/models.py), and the trigger on the
engine's run history that writes an event's deliveries in the event's own transaction
(webhooks_enqueue_v1).

The trigger's SQL is frozen here: what this migration ran, whatever its current text is now
(webhooks/sql.py, checked against the migrated database by tests/test_schema_functions.py).
A change to it is a new version and a migration."""

import django.contrib.postgres.fields
import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


ENQUEUE_V1 = """
CREATE OR REPLACE FUNCTION webhooks_enqueue_v1() RETURNS trigger
LANGUAGE plpgsql AS $function$
DECLARE
    v_type text := CASE
        WHEN NEW.kind <> 'step.waiting' THEN NEW.kind
        WHEN NEW.detail ? 'approval' THEN 'approval.requested'
        ELSE 'task.requested' END;
    v_run jsonb;
    v_data jsonb;
BEGIN
    PERFORM 1 FROM webhooks_subscription s
     WHERE s.org_id = NEW.org_id AND s.active AND v_type = ANY(s.event_types);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT jsonb_build_object('id', r.id, 'automation', a.slug, 'version', v.number,
                              'start_key', r.start_key)
      INTO v_run
      FROM workflows_run r
      JOIN workflows_automation a ON a.id = r.automation_id
      JOIN workflows_automationversion v ON v.id = r.version_id
     WHERE r.id = NEW.run_id;
    v_data := jsonb_build_object('run', v_run,
                                 'detail', COALESCE(NEW.detail, '{}'::jsonb) - 'version_id')
           || CASE WHEN NEW.step_id <> ''
                   THEN jsonb_build_object('step', jsonb_build_object(
                            'id', NEW.step_id, 'iteration', NEW.iteration,
                            'attempt', NEW.attempt))
                   ELSE '{}'::jsonb END;
    INSERT INTO webhooks_delivery (org_id, subscription_id, event_id, event_type, run_id,
                                   payload, occurred_at, status, attempts, next_at, token,
                                   last_error, last_response, created_at)
    SELECT NEW.org_id, s.id, NEW.id, v_type, NEW.run_id, v_data, NEW.at, 'pending', 0, now(),
           '', '', '', now()
      FROM webhooks_subscription s
     WHERE s.org_id = NEW.org_id AND s.active AND v_type = ANY(s.event_types);
    RETURN NULL;
END
$function$;

CREATE TRIGGER webhooks_enqueue
 AFTER INSERT ON workflows_runevent
 FOR EACH ROW WHEN (
     NEW.kind IN ('run.started', 'run.succeeded', 'run.failed', 'run.cancelled', 'step.failed',
                  'effect.needs_review')
     OR (NEW.kind = 'step.waiting' AND (NEW.detail ? 'approval' OR NEW.detail ? 'task')))
 EXECUTE FUNCTION webhooks_enqueue_v1();
"""

DROP_ENQUEUE_V1 = """
DROP TRIGGER IF EXISTS webhooks_enqueue ON workflows_runevent;
DROP FUNCTION IF EXISTS webhooks_enqueue_v1();
"""


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('workflows', '0023_audit_log'),
    ]

    operations = [
        migrations.CreateModel(
            name='Subscription',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('url', models.CharField(max_length=2000)),
                ('description', models.CharField(blank=True, default='', max_length=200)),
                ('event_types', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=40), size=None)),
                ('secret_encrypted', models.TextField(editable=False)),
                ('active', models.BooleanField(default=True)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('org', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='webhook_subscriptions', to='workflows.organisation')),
            ],
            options={
                'ordering': ['-id'],
            },
        ),
        migrations.CreateModel(
            name='Delivery',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event_id', models.BigIntegerField()),
                ('event_type', models.CharField(max_length=40)),
                ('run_id', models.BigIntegerField(null=True)),
                ('payload', models.JSONField()),
                ('occurred_at', models.DateTimeField()),
                ('status', models.CharField(choices=[('pending', 'Pending'), ('delivered', 'Delivered'), ('failed', 'Failed')], default='pending', max_length=16)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('next_at', models.DateTimeField()),
                ('lease_until', models.DateTimeField(blank=True, null=True)),
                ('token', models.CharField(blank=True, default='', max_length=32)),
                ('last_attempt_at', models.DateTimeField(blank=True, null=True)),
                ('last_status', models.PositiveIntegerField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True, default='')),
                ('last_response', models.TextField(blank=True, default='')),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('org', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='workflows.organisation')),
                ('subscription', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='webhooks.subscription')),
            ],
            options={
                'verbose_name_plural': 'deliveries',
                'ordering': ['-id'],
            },
        ),
        migrations.AddIndex(
            model_name='subscription',
            index=models.Index(condition=models.Q(('active', True)), fields=['org'], name='webhook_sub_active'),
        ),
        migrations.AddIndex(
            model_name='delivery',
            index=models.Index(fields=['org', '-id'], name='webhook_delivery_org'),
        ),
        migrations.AddIndex(
            model_name='delivery',
            index=models.Index(fields=['subscription', '-id'], name='webhook_delivery_sub'),
        ),
        migrations.AddIndex(
            model_name='delivery',
            index=models.Index(condition=models.Q(('status', 'pending')), fields=['org', 'next_at'], name='webhook_pending'),
        ),
        migrations.AddIndex(
            model_name='delivery',
            index=models.Index(condition=models.Q(('lease_until__isnull', False), ('status', 'pending')), fields=['org', 'lease_until'], name='webhook_in_flight'),
        ),
        migrations.AddIndex(
            model_name='delivery',
            index=models.Index(condition=models.Q(('status', 'pending'), _negated=True), fields=['created_at'], name='webhook_finished'),
        ),
        migrations.AddConstraint(
            model_name='delivery',
            constraint=models.UniqueConstraint(fields=('subscription', 'event_id'), name='webhook_once'),
        ),
        migrations.RunSQL(sql=ENQUEUE_V1, reverse_sql=DROP_ENQUEUE_V1),
    ]
