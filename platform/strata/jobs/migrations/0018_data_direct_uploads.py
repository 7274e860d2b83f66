from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0017_retention'),
    ]

    operations = [
        migrations.AddField(
            model_name='dataupload',
            name='store_upload',
            field=models.CharField(blank=True, default='', max_length=1024),
        ),
    ]
