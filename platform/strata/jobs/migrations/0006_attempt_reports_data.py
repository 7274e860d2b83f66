"""Attempt.sharing (what gpushare's device service measured about an attempt) moves into the generic report
channel: Attempt.reports["gpushare"] and Attempt.measured_memory. The next migration drops Attempt.sharing.

History may name plugins (migrations are exempt from the core-names check): these rows were gpushare's."""

from django.db import migrations, models

PLUGIN = "gpushare"
FIELDS = ("policy", "state", "lane", "persistent", "ephemeral", "steps")


def _bytes(value) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def move_attempt_sharing(apps, schema_editor):
    Attempt = apps.get_model("jobs", "Attempt")
    Allocation = apps.get_model("jobs", "Allocation")
    Device = apps.get_model("cluster", "Device")
    # Attempts a device's latest report lists ran there then: their report shares the device report's time.
    current = {}
    for device_id, node_id, sharing in Device.objects.values_list("id", "node_id", "sharing").iterator():
        sharing = sharing or {}
        for job in sharing.get("jobs", []) or []:
            current[str(job.get("attempt"))] = (device_id, str(node_id), float(sharing.get("reported_at") or 0.0))
    rows = Attempt.objects.filter(sharing__isnull=False).values_list(
        "id", "node_id", "sharing", "reports", "started_at", "ended_at")
    for attempt_id, node_id, sharing, reports, started_at, ended_at in rows.iterator():
        if not isinstance(sharing, dict):
            continue
        where = current.get(str(attempt_id))
        if where is None:
            device_id = (Allocation.objects.filter(attempt_id=attempt_id).order_by("rank")
                         .values_list("device_id", flat=True).first())
            when = ended_at or started_at
            where = (device_id, str(node_id) if node_id else None, when.timestamp() if when else 0.0)
        device_id, node, time = where
        merged = dict(reports or {})
        merged[PLUGIN] = {"time": time, "payload": {key: sharing.get(key) for key in FIELDS},
                          "node": node, "device": device_id}
        memory = _bytes(sharing.get("persistent")) + _bytes(sharing.get("ephemeral"))
        Attempt.objects.filter(pk=attempt_id).update(reports=merged, measured_memory=memory)


def restore_attempt_sharing(apps, schema_editor):
    Attempt = apps.get_model("jobs", "Attempt")
    for attempt_id, reports in Attempt.objects.filter(reports__isnull=False).values_list("id", "reports").iterator():
        entry = (reports or {}).get(PLUGIN)
        if isinstance(entry, dict) and isinstance(entry.get("payload"), dict):
            Attempt.objects.filter(pk=attempt_id).update(
                sharing={key: entry["payload"].get(key) for key in FIELDS})


class Migration(migrations.Migration):

    dependencies = [
        ('cluster', '0003_reports'),
        ('jobs', '0005_job_parent'),
    ]

    operations = [
        migrations.AddField(
            model_name='attempt',
            name='measured_memory',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(move_attempt_sharing, restore_attempt_sharing),
    ]
