from django.db import migrations, models


class Migration(migrations.Migration):
    # A nullable column without a default: adding it rewrites nothing (a catalogue change).
    dependencies = [
        ("workflows", "0021_sweep_lease_belongs_to_the_engine"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="trace_context",
            field=models.TextField(blank=True, editable=False, null=True),
        ),
    ]
