from django.db import migrations


class Migration(migrations.Migration):
    # Apart from the data migration: PostgreSQL refuses to alter a table with pending trigger events.

    dependencies = [
        ('jobs', '0006_attempt_reports_data'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='attempt',
            name='sharing',
        ),
    ]
