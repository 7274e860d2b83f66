from django.db import migrations, models


class Migration(migrations.Migration):
    # Jobs that need no GPU: the nodes report their CPUs and host memory, and each such node gets a CPU device
    # (kind "cpu") that CPU reservations are allocated on.

    dependencies = [
        ('cluster', '0005_remove_device_sharing'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='cpus',
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='node',
            name='memory',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='device',
            name='kind',
            field=models.CharField(choices=[('cuda', 'Cuda'), ('virtual', 'Virtual'), ('cpu', 'Cpu')], max_length=16),
        ),
    ]
