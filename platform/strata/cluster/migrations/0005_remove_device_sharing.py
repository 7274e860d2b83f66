from django.db import migrations


class Migration(migrations.Migration):
    # Apart from the data migration: PostgreSQL refuses to alter a table with pending trigger events. After
    # jobs 0006, which reads Device.sharing to place the attempts the devices' latest reports listed.

    dependencies = [
        ('cluster', '0004_device_reports'),
        ('jobs', '0006_attempt_reports_data'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='device',
            name='sharing',
        ),
    ]
