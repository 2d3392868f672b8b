"""The audit log (models/audit.py): one append-only entry per action a person, an API key or
a command takes. The database refuses to change or delete an entry (the trigger below, SQLSTATE
WM002), except the retention purge, which announces its horizon in its own transaction.

The trigger's SQL is frozen here: what this migration ran, whatever its current text is now
(workflows/engine/sql/functions.py, checked against the migrated database by
tests/test_schema_functions.py). A change to it is a new version and a migration."""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


AUDIT_APPEND_ONLY_V1 = """
CREATE OR REPLACE FUNCTION waymark_audit_append_only_v1() RETURNS trigger
LANGUAGE plpgsql AS $function$
BEGIN
    IF TG_OP = 'DELETE'
       AND OLD.at < NULLIF(current_setting('waymark.audit_purge_before', true), '')::timestamptz
    THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit entry % is append-only: % refused', OLD.id, TG_OP
        USING ERRCODE = 'WM002',
              HINT = 'Audit entries are never changed; only the retention purge deletes them.';
END;
$function$;

CREATE TRIGGER audit_append_only
BEFORE UPDATE OR DELETE ON workflows_auditentry
FOR EACH ROW EXECUTE FUNCTION waymark_audit_append_only_v1();
"""

DROP_AUDIT_APPEND_ONLY_V1 = """
DROP TRIGGER IF EXISTS audit_append_only ON workflows_auditentry;
DROP FUNCTION IF EXISTS waymark_audit_append_only_v1();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0022_run_trace_context'),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('actor_kind', models.CharField(choices=[('user', 'User'), ('api_key', 'Api Key'), ('slack_user', 'Slack User'), ('command', 'Command'), ('system', 'System')], max_length=16)),
                ('actor_id', models.CharField(max_length=150)),
                ('actor_display', models.CharField(max_length=150)),
                ('action', models.CharField(max_length=64)),
                ('target_type', models.CharField(max_length=40)),
                ('target_id', models.CharField(max_length=200)),
                ('detail', models.JSONField(blank=True, default=dict)),
                ('org', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, to='workflows.organisation')),
            ],
            options={
                'verbose_name_plural': 'audit entries',
                'ordering': ['-id'],
                'indexes': [models.Index(fields=['org', '-id'], name='audit_org_id'), models.Index(fields=['org', 'target_type', 'target_id', '-id'], name='audit_target'), models.Index(fields=['at'], name='audit_at')],
            },
        ),
        migrations.RunSQL(sql=AUDIT_APPEND_ONLY_V1, reverse_sql=DROP_AUDIT_APPEND_ONLY_V1),
    ]
