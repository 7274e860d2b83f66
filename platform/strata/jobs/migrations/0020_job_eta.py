from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0019_log_search"),
    ]

    operations = [
        migrations.AddField(model_name="job", name="eta", field=models.JSONField(blank=True, null=True)),
        migrations.AddField(model_name="job", name="eta_at", field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="job", name="eta_first", field=models.JSONField(blank=True, null=True)),
    ]
