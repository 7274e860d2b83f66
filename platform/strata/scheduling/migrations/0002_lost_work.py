import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0005_roles_member_limits"),
        ("jobs", "0020_job_eta"),
        ("scheduling", "0001_leader_lease"),
    ]

    operations = [
        migrations.CreateModel(
            name="LostWork",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("cause", models.CharField(choices=[("preempted", "Preempted"), ("shrunk", "Shrunk"),
                                                    ("node_lost", "Node Lost")], max_length=16)),
                ("time", models.DateTimeField(db_index=True, help_text="When the attempt ended.")),
                ("steps", models.BigIntegerField(blank=True, help_text="Steps lost; null when the job reports none.",
                                                 null=True)),
                ("seconds", models.FloatField(default=0.0, help_text="Seconds of work lost (since the checkpoint or "
                                                                     "the start).")),
                ("gpu_seconds", models.FloatField(default=0.0, help_text="seconds times the attempt's GPU share.")),
                ("checkpoint", models.BooleanField(default=False, help_text="Whether the job had a checkpoint to "
                                                                            "resume from.")),
                ("checkpoint_step", models.BigIntegerField(blank=True, help_text="The step reached at that "
                                                                                 "checkpoint.", null=True)),
                ("attempt", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE,
                                                 related_name="lost_work", to="jobs.attempt")),
                ("job", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="lost_work",
                                          to="jobs.job")),
                ("team", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="lost_work",
                                           to="accounts.team")),
            ],
            options={
                "indexes": [models.Index(fields=["team", "time"], name="scheduling__team_id_a5937a_idx")],
            },
        ),
    ]
