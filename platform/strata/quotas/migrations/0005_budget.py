from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('quotas', '0004_retention'),
    ]

    operations = [
        migrations.AddField(
            model_name='quota',
            name='budget_gpu_hours',
            field=models.FloatField(blank=True, help_text='GPU-hours (allocated) the team may spend per budget period; forecast, never enforced (strata.quotas.usage).', null=True),
        ),
        migrations.AddField(
            model_name='quota',
            name='budget_period_days',
            field=models.PositiveIntegerField(blank=True, help_text='Length of the budget period in days, counted from 1970-01-01 UTC; null: the calendar month (UTC).', null=True),
        ),
    ]
