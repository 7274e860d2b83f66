from django.db import migrations, models

# Until this migration an attempt whose hosting node service died was recorded as node_lost with a reason
# starting with this text; it has an outcome of its own now.
LOST_REASON = "GPU-sharing service died"


def forwards(apps, schema_editor):
    Attempt = apps.get_model("jobs", "Attempt")
    Attempt.objects.filter(outcome="node_lost", exit_reason__startswith=LOST_REASON).update(outcome="service_lost")


def backwards(apps, schema_editor):
    Attempt = apps.get_model("jobs", "Attempt")
    Attempt.objects.filter(outcome="service_lost").update(outcome="node_lost")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0007_remove_attempt_sharing"),
    ]

    operations = [
        migrations.AlterField(
            model_name="attempt",
            name="outcome",
            field=models.CharField(blank=True, choices=[
                ("succeeded", "Succeeded"), ("failed", "Failed"), ("cancelled", "Cancelled"),
                ("preempted", "Preempted"), ("node_lost", "Node Lost"), ("time_limit", "Time Limit"),
                ("service_lost", "Service Lost")], max_length=16),
        ),
        migrations.RunPython(forwards, backwards),
    ]
