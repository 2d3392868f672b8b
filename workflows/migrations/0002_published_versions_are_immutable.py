"""Enforce in the database what AutomationVersion.save() enforces in Python.

Any UPDATE or DELETE of a row whose published_at was already set fails with SQLSTATE WM001,
whatever issued it (a QuerySet.update(), raw SQL, psql). Publishing itself is the UPDATE that
sets published_at on a draft, so it is allowed; nothing after it is.
"""

from django.db import migrations

FORWARD = """
CREATE FUNCTION waymark_published_version_is_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.published_at IS NOT NULL THEN
        RAISE EXCEPTION 'automation version % (v%) is published and cannot change',
            OLD.id, OLD.number
            USING ERRCODE = 'WM001',
                  HINT = 'Create a new version instead.';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER published_version_is_immutable
BEFORE UPDATE OR DELETE ON workflows_automationversion
FOR EACH ROW EXECUTE FUNCTION waymark_published_version_is_immutable();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS published_version_is_immutable ON workflows_automationversion;
DROP FUNCTION IF EXISTS waymark_published_version_is_immutable();
"""


class Migration(migrations.Migration):
    dependencies = [("workflows", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
