"""Versions keep their document as written (``definition_text``), keys in their order: jsonb
stores objects with its own key order, so a definition read back had ``type`` buried in the
middle of each step.

Versions written before this keep the order jsonb gave them (the order they were sent in is
gone): their text is filled from the jsonb, so every row has one. Published versions refuse
every UPDATE (trigger published_version_is_immutable, migration 0002): it is set aside for
this one fill, inside the migration's transaction, and is back before anything else can
write.
"""

import json

from django.db import migrations, models

TRIGGER = "published_version_is_immutable"


def fill_from_jsonb(apps, schema_editor):
    Version = apps.get_model("workflows", "AutomationVersion")
    table = Version._meta.db_table
    schema_editor.execute(f"ALTER TABLE {table} DISABLE TRIGGER {TRIGGER}")
    rows = Version.objects.filter(definition_text="").values_list("id", "definition")
    for pk, definition in rows.iterator(chunk_size=500):
        text = json.dumps(definition, ensure_ascii=False, indent=2)
        Version.objects.filter(pk=pk).update(definition_text=text)
    schema_editor.execute(f"ALTER TABLE {table} ENABLE TRIGGER {TRIGGER}")


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0025_run_search"),
    ]

    operations = [
        migrations.AddField(
            model_name="automationversion",
            name="definition_text",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.RunPython(fill_from_jsonb, migrations.RunPython.noop, elidable=True),
    ]
