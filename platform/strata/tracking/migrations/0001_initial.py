# The MLflow bridge: TrackingServer (one per team) and JobMirror (one per mirrored job). Written by hand.

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('accounts', '0004_team_secrets'),
        ('jobs', '0018_data_direct_uploads'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='TrackingServer',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('url', models.CharField(max_length=500)),
                ('experiment', models.CharField(help_text="The MLflow experiment's name.", max_length=250)),
                ('experiment_id', models.CharField(blank=True, help_text='Found or created on the server.', max_length=64)),
                ('token_ciphertext', models.TextField(blank=True, help_text='The bearer token, a Fernet token; empty: none.')),
                ('configured_at', models.DateTimeField(default=django.utils.timezone.now, help_text='Jobs that ended before this are not mirrored.')),
                ('error', models.CharField(blank=True, help_text="The last mirror round's error; empty: ok.", max_length=1000)),
                ('error_at', models.DateTimeField(blank=True, null=True)),
                ('failures', models.PositiveIntegerField(default=0, help_text='Mirror rounds failed in a row.')),
                ('retry_at', models.DateTimeField(blank=True, help_text='No mirror round before this (backoff).', null=True)),
                ('synced_at', models.DateTimeField(blank=True, help_text='The last mirror round that succeeded.', null=True)),
                ('busy_until', models.DateTimeField(blank=True, help_text="A worker runs the team's round until then (or until it ends).", null=True)),
                ('team', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='tracking_server', to='accounts.team')),
                ('updated_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
        ),
        migrations.CreateModel(
            name='JobMirror',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('run_id', models.CharField(max_length=64)),
                ('experiment_id', models.CharField(max_length=64)),
                ('artifact_uri', models.CharField(blank=True, max_length=1000)),
                ('last_metric', models.BigIntegerField(default=0, help_text='The id of the newest MetricPoint sent.')),
                ('state', models.CharField(choices=[('active', 'Active'), ('done', 'Done')], db_index=True, default='active', max_length=8)),
                ('artifacts', models.JSONField(blank=True, default=dict, help_text="{artifact id: 'uploaded' | why it was skipped}.")),
                ('error', models.CharField(blank=True, max_length=1000)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('job', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='tracking_mirror', to='jobs.job')),
                ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='accounts.team')),
            ],
            options={
                'indexes': [models.Index(fields=['team', 'state'], name='tracking_mirror_team_state')],
            },
        ),
    ]
