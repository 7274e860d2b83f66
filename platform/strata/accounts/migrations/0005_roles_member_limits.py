from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0004_team_secrets"),
    ]

    operations = [
        migrations.AlterField(
            model_name="membership",
            name="role",
            field=models.CharField(choices=[("viewer", "Viewer"), ("member", "Member"), ("team-admin", "Team Admin")],
                                   default="member", max_length=16),
        ),
        migrations.AddField(
            model_name="membership",
            name="max_concurrent_jobs",
            field=models.PositiveIntegerField(
                blank=True, null=True,
                help_text="The user's admitted (queued or running) jobs in this team at once."),
        ),
        migrations.AddField(
            model_name="membership",
            name="max_gpus",
            field=models.FloatField(blank=True, null=True,
                                    help_text="GPUs the user's jobs in this team hold at once (fractional)."),
        ),
    ]
