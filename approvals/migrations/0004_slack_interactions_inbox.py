"""The inbox of Slack clicks (``SlackInteraction``): a click is recorded when it arrives and
answered at once; it is decided after the answer (approvals/inbox.py), so Slack's 3-second
limit never waits on the request's row lock. ``approval_id`` is deliberately not a foreign
key (its key-share lock would wait on that very row lock)."""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0003_ask_again_after_a_retry'),
        ('workflows', '0018_settle_hops_set_based'),
    ]

    operations = [
        migrations.CreateModel(
            name='SlackInteraction',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('approval_id', models.BigIntegerField()),
                ('decision', models.CharField(max_length=16)),
                ('token', models.JSONField()),
                ('block_id', models.CharField(blank=True, default='', max_length=255)),
                ('team_id', models.CharField(max_length=32)),
                ('slack_user_id', models.CharField(max_length=32)),
                ('ip', models.GenericIPAddressField(blank=True, null=True)),
                ('response_url', models.TextField(blank=True, default='')),
                ('received_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('attempts', models.PositiveSmallIntegerField(default=0)),
                ('applied_at', models.DateTimeField(blank=True, null=True)),
                ('outcome', models.CharField(blank=True, default='', max_length=32)),
                ('reply', models.TextField(blank=True, default='')),
                ('replied_at', models.DateTimeField(blank=True, null=True)),
                ('org', models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='workflows.organisation')),
            ],
            options={
                'ordering': ['-id'],
                'indexes': [models.Index(condition=models.Q(('applied_at__isnull', True)), fields=['id'], name='slack_interaction_pending'), models.Index(fields=['applied_at'], name='slack_interaction_applied')],
            },
        ),
    ]
