from django.db import migrations, models


class Migration(migrations.Migration):
    # Jobs that need no GPU reserve CPUs and host memory: limits on what a team reserves at once.

    dependencies = [
        ('quotas', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='quota',
            name='max_cpus',
            field=models.FloatField(blank=True, help_text='CPUs reserved at once (fractional).', null=True),
        ),
        migrations.AddField(
            model_name='quota',
            name='max_memory',
            field=models.BigIntegerField(blank=True, help_text='Host memory reserved at once, bytes.', null=True),
        ),
    ]
