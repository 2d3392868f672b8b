"""Erasing a person (workflows/services/erasure/): the tombstone each erasure leaves, and the
audit log's trigger in its version 2, which lets an erasure rewrite the target and detail of
its organisation's entries (announced in its own transaction), and nothing else.

The trigger's SQL is frozen here: what this migration ran, whatever its current text is now
(workflows/engine/sql/functions.py, checked against the migrated database by
tests/test_schema_functions.py)."""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


DROP_V1 = """
DROP TRIGGER IF EXISTS audit_append_only ON workflows_auditentry;
DROP FUNCTION IF EXISTS waymark_audit_append_only_v1();
"""

AUDIT_APPEND_ONLY_V2 = """
CREATE OR REPLACE FUNCTION waymark_audit_append_only_v2() RETURNS trigger
LANGUAGE plpgsql AS $function$
BEGIN
    IF TG_OP = 'DELETE'
       AND OLD.at < NULLIF(current_setting('waymark.audit_purge_before', true), '')::timestamptz
    THEN
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE'
       AND OLD.org_id::text = NULLIF(current_setting('waymark.audit_erasure_org', true), '')
       AND NEW.id = OLD.id AND NEW.org_id = OLD.org_id AND NEW.at = OLD.at
       AND NEW.actor_kind = OLD.actor_kind AND NEW.actor_id = OLD.actor_id
       AND NEW.actor_display = OLD.actor_display AND NEW.action = OLD.action
       AND NEW.target_type = OLD.target_type
    THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'audit entry % is append-only: % refused', OLD.id, TG_OP
        USING ERRCODE = 'WM002',
              HINT = 'Audit entries are never changed; only the retention purge deletes them.';
END;
$function$;

CREATE TRIGGER audit_append_only
BEFORE UPDATE OR DELETE ON workflows_auditentry
FOR EACH ROW EXECUTE FUNCTION waymark_audit_append_only_v2();
"""

DROP_V2 = """
DROP TRIGGER IF EXISTS audit_append_only ON workflows_auditentry;
DROP FUNCTION IF EXISTS waymark_audit_append_only_v2();
"""

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


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0028_run_rerun'),
    ]

    operations = [
        migrations.CreateModel(
            name='Erasure',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('actor_kind', models.CharField(max_length=16)),
                ('actor_id', models.CharField(max_length=150)),
                ('actor_display', models.CharField(max_length=150)),
                ('subject_kind', models.CharField(max_length=16)),
                ('subject_digest', models.CharField(max_length=80)),
                ('runs_cancelled', models.JSONField(default=list)),
                ('runs_finishing', models.JSONField(default=list)),
                ('runs_scrubbed', models.JSONField(default=list)),
                ('values_removed', models.PositiveIntegerField(default=0)),
                ('counts', models.JSONField(default=dict)),
                ('org', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, to='workflows.organisation')),
                ('repeat_of', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='workflows.erasure')),
            ],
            options={
                'ordering': ['-id'],
                'indexes': [models.Index(fields=['org', '-id'], name='erasure_org_id'), models.Index(fields=['org', 'subject_digest'], name='erasure_org_subject')],
            },
        ),
        migrations.RunSQL(DROP_V1 + AUDIT_APPEND_ONLY_V2, DROP_V2 + AUDIT_APPEND_ONLY_V1),
    ]
