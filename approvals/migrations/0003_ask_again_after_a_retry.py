"""A request belongs to its step's series of attempts (``Step.series_offset``): an operator's
retry of a step whose request ended without a decision asks again, as a new request of the
new series (approvals/steptypes.py). Existing requests are of series 0."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("approvals", "0002_requests_go_with_their_run")]

    operations = [
        migrations.RemoveConstraint(
            model_name="approvalrequest",
            name="approval_run_step_iteration",
        ),
        migrations.AddField(
            model_name="approvalrequest",
            name="series",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddConstraint(
            model_name="approvalrequest",
            constraint=models.UniqueConstraint(
                fields=("run", "step_id", "iteration", "series"),
                name="approval_run_step_iteration_series",
            ),
        ),
    ]
