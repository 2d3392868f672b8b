from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0009_retention"),
    ]

    operations = [
        migrations.CreateModel(
            name="IdleWorker",
            fields=[
                ("worker", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("lane", models.CharField(max_length=32)),
                ("idle_until", models.DateTimeField()),
            ],
        ),
        # A hint, rewritten as workers come and go: no WAL for it, and a crash empties it.
        migrations.RunSQL(
            "ALTER TABLE workflows_idleworker SET UNLOGGED",
            "ALTER TABLE workflows_idleworker SET LOGGED",
        ),
    ]
