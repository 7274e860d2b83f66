"""The plugins' time series of the generic report channel (ReportSeries), with gpushare's ShareSlice rows
copied in (plugin "gpushare", no data). The next migration drops ShareSlice.

History may name plugins (migrations are exempt from the core-names check): these rows were gpushare's."""

import django.db.models.deletion
from django.db import migrations, models

PLUGIN = "gpushare"
BATCH = 5000


def copy_share_slices(apps, schema_editor):
    ShareSlice = apps.get_model("telemetry", "ShareSlice")
    ReportSeries = apps.get_model("telemetry", "ReportSeries")
    batch = []
    rows = ShareSlice.objects.order_by("id").values_list("device_id", "attempt_id", "job_id", "start", "end")
    for device_id, attempt_id, job_id, start, end in rows.iterator(chunk_size=BATCH):
        batch.append(ReportSeries(plugin=PLUGIN, device_id=device_id, attempt_id=attempt_id, job_id=job_id,
                                  start=start, end=end, data={}))
        if len(batch) >= BATCH:
            ReportSeries.objects.bulk_create(batch)
            batch = []
    ReportSeries.objects.bulk_create(batch)


def restore_share_slices(apps, schema_editor):
    ShareSlice = apps.get_model("telemetry", "ShareSlice")
    ReportSeries = apps.get_model("telemetry", "ReportSeries")
    rows = (ReportSeries.objects.filter(plugin=PLUGIN, device__isnull=False, attempt__isnull=False, job__isnull=False)
            .order_by("id").values_list("device_id", "attempt_id", "job_id", "start", "end"))
    ShareSlice.objects.bulk_create([ShareSlice(device_id=device_id, attempt_id=attempt_id, job_id=job_id, start=start,
                                               end=end) for device_id, attempt_id, job_id, start, end in rows],
                                   batch_size=BATCH)


class Migration(migrations.Migration):

    dependencies = [
        ('cluster', '0004_device_reports'),
        ('jobs', '0006_attempt_reports_data'),
        ('telemetry', '0003_share_slices'),
    ]

    operations = [
        migrations.CreateModel(
            name='ReportSeries',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('plugin', models.CharField(max_length=40)),
                ('start', models.DateTimeField()),
                ('end', models.DateTimeField()),
                ('data', models.JSONField(blank=True, default=dict)),
                ('attempt', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='report_series', to='jobs.attempt')),
                ('device', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='report_series', to='cluster.device')),
                ('job', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='report_series', to='jobs.job')),
            ],
            options={
                'ordering': ['start'],
                'indexes': [models.Index(fields=['plugin', 'start'], name='telemetry_series_plugin_start'), models.Index(fields=['plugin', 'device', 'start'], name='telemetry_series_device_start'), models.Index(fields=['plugin', 'job', 'start'], name='telemetry_series_job_start'), models.Index(fields=['start'], name='telemetry_series_start')],
            },
        ),
        migrations.RunPython(copy_share_slices, restore_share_slices),
    ]
