from django.db import migrations


class Migration(migrations.Migration):
    # Apart from the data migration (see cluster 0005).

    dependencies = [
        ('telemetry', '0004_report_series'),
    ]

    operations = [
        migrations.DeleteModel(
            name='ShareSlice',
        ),
    ]
