"""A timer is cancelled with its step (``cancelled_at``), by a trigger on the engine's steps
(timers/sql.py CANCEL_WITH_STEP_V1): a cancelled run's timers no longer fire at their time.
Pending now means neither fired nor cancelled, so both partial indexes are rebuilt with it.
A timer left pending by a step cancelled before this migration is recorded as cancelled
when it comes due (sql.MARK_FIRED)."""

from django.db import migrations, models

from timers.sql import CANCEL_WITH_STEP_V1, DROP_CANCEL_WITH_STEP_V1


class Migration(migrations.Migration):

    dependencies = [
        ('timers', '0004_next_due_index_for_all_orgs'),
        ('workflows', '0018_settle_hops_set_based'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='timer',
            name='timer_pending',
        ),
        migrations.RemoveIndex(
            model_name='timer',
            name='timer_next_due',
        ),
        migrations.AddField(
            model_name='timer',
            name='cancelled_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='timer',
            index=models.Index(condition=models.Q(('cancelled_at__isnull', True), ('fired_at__isnull', True)), fields=['org', 'due_at'], name='timer_pending'),
        ),
        migrations.AddIndex(
            model_name='timer',
            index=models.Index(condition=models.Q(('cancelled_at__isnull', True), ('fired_at__isnull', True), ('org_id__gt', 0)), fields=['due_at'], name='timer_next_due'),
        ),
        migrations.RunSQL(sql=CANCEL_WITH_STEP_V1, reverse_sql=DROP_CANCEL_WITH_STEP_V1),
    ]
