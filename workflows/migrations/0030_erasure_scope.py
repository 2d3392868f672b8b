"""Erasure's reach: an API key's scopes (``erasure``: erasing a person), the admin's own
permission to erase (``workflows.erase_person``), and the audit log's trigger in its version
3, which no erasure may pass (version 2 let one rewrite an entry's target and detail).

The trigger's SQL is frozen here: what this migration ran, whatever its current text is now
(workflows/engine/sql/functions.py, checked against the migrated database by
tests/test_schema_functions.py)."""

import django.contrib.postgres.fields
from django.db import migrations, models

DROP_V2 = """
DROP TRIGGER IF EXISTS audit_append_only ON workflows_auditentry;
DROP FUNCTION IF EXISTS waymark_audit_append_only_v2();
"""

AUDIT_APPEND_ONLY_V3 = """
CREATE OR REPLACE FUNCTION waymark_audit_append_only_v3() RETURNS trigger
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
FOR EACH ROW EXECUTE FUNCTION waymark_audit_append_only_v3();
"""

DROP_V3 = """
DROP TRIGGER IF EXISTS audit_append_only ON workflows_auditentry;
DROP FUNCTION IF EXISTS waymark_audit_append_only_v3();
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


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0029_erasure'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='erasure',
            options={'ordering': ['-id'], 'permissions': [('erase_person', 'Can erase a person')]},
        ),
        migrations.AddField(
            model_name='apikey',
            name='scopes',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=32), blank=True, default=list, size=None),
        ),
        migrations.RunSQL(DROP_V2 + AUDIT_APPEND_ONLY_V3, DROP_V3 + AUDIT_APPEND_ONLY_V2),
    ]
