from django.db import migrations


class Migration(migrations.Migration):
    """`released` was a count of hand-backs; its name now says so."""

    dependencies = [("workflows", "0007_suspects_claimed_alone")]

    operations = [
        migrations.RenameField(model_name="step", old_name="released", new_name="release_count"),
    ]
