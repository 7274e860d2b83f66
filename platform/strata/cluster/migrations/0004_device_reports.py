"""Device.sharing (gpushare's device service's latest report) moves into the generic report channel:
Device.reports["gpushare"]. The next migration drops Device.sharing.

History may name plugins (migrations are exempt from the core-names check): these rows were gpushare's."""

from django.db import migrations, models

PLUGIN = "gpushare"


def device_payload(sharing: dict) -> dict:
    """gpushare's device part (components.gpushare.report.GpuShareReport.parts) of an old Device.sharing."""
    return {"policy": sharing.get("policy"), "switches": sharing.get("switches"),
            "switch_latency_ms": sharing.get("switch_latency_ms") or {}, "utilization": sharing.get("utilization"),
            "budget": sharing.get("budget"),
            "lanes": [{"id": lane.get("id"), "size": lane.get("size"), "jobs": len(lane.get("attempts") or [])}
                      for lane in sharing.get("lanes") or []]}


def move_device_sharing(apps, schema_editor):
    Device = apps.get_model("cluster", "Device")
    for device_id, sharing, reports in Device.objects.exclude(sharing={}).values_list(
            "id", "sharing", "reports").iterator():
        if not isinstance(sharing, dict) or not sharing:
            continue
        merged = dict(reports or {})
        merged[PLUGIN] = {"time": float(sharing.get("reported_at") or 0.0), "payload": device_payload(sharing),
                          "series_until": float(sharing.get("slices_until") or 0.0)}
        Device.objects.filter(pk=device_id).update(reports=merged)


def restore_device_sharing(apps, schema_editor):
    Device = apps.get_model("cluster", "Device")
    for device_id, reports in Device.objects.exclude(reports={}).values_list("id", "reports").iterator():
        entry = (reports or {}).get(PLUGIN)
        if not isinstance(entry, dict) or not isinstance(entry.get("payload"), dict):
            continue
        payload = entry["payload"]
        Device.objects.filter(pk=device_id).update(sharing={
            **{key: payload.get(key) for key in ("policy", "switches", "switch_latency_ms", "utilization", "budget")},
            "lanes": [{"id": lane.get("id"), "size": lane.get("size"), "attempts": []}
                      for lane in payload.get("lanes") or []],
            "jobs": [], "reported_at": entry.get("time"), "slices_until": entry.get("series_until") or 0.0})


class Migration(migrations.Migration):

    dependencies = [
        ('cluster', '0003_reports'),
    ]

    operations = [
        migrations.AddField(
            model_name='device',
            name='reports',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(move_device_sharing, restore_device_sharing),
    ]
