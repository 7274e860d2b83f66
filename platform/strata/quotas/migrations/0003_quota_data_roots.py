from django.db import migrations, models


class Migration(migrations.Migration):
    # Data roots per team: the directories on the nodes under which a team may register data by path.

    dependencies = [
        ('quotas', '0002_quota_max_cpus_max_memory'),
    ]

    operations = [
        migrations.AddField(
            model_name='quota',
            name='data_roots',
            field=models.JSONField(blank=True, default=list, help_text='Directories on the nodes under which the team may register data (absolute, normalized paths; strata.quotas.roots).'),
        ),
    ]
