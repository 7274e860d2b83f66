"""Log search (strata.jobs.log_search): each line's rank, what a job's logs lost (the line cap, the retention
collector), and the search indexes of the database's kind: PostgreSQL, a stored generated column message_tsv =
to_tsvector('simple', message) with a GIN index and, where pg_trgm can be created, a trigram GIN index for grep;
SQLite, an external-content FTS5 table kept in sync by triggers. Reversible."""

import re

from django.db import migrations, models

RANK_PREFIX = re.compile(r"\[rank (\d{1,6})\] ")


def ranks_forward(apps, schema_editor):
    """Fill LogLine.rank from the lines' "[rank N] " prefixes (as strata.jobs.log_search.rank_of does)."""
    LogLine = apps.get_model("jobs", "LogLine")
    using = schema_editor.connection.alias
    batch = []
    for pk, message in LogLine.objects.using(using).filter(message__startswith="[rank ").values_list(
            "id", "message").iterator(chunk_size=2000):
        match = RANK_PREFIX.match(message)
        if match:
            batch.append(LogLine(id=pk, rank=int(match.group(1))))
        if len(batch) >= 2000:
            LogLine.objects.using(using).bulk_update(batch, ["rank"])
            batch = []
    if batch:
        LogLine.objects.using(using).bulk_update(batch, ["rank"])


def indexes_forward(apps, schema_editor):
    from strata.jobs.log_search import create_indexes

    create_indexes(schema_editor)


def indexes_backward(apps, schema_editor):
    from strata.jobs.log_search import drop_indexes

    drop_indexes(schema_editor)


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0018_data_direct_uploads'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='log_dropped_after',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='log_lines_dropped',
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='job',
            name='log_lines_trimmed',
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='job',
            name='log_trimmed_before',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='logline',
            name='rank',
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='logline',
            index=models.Index(fields=['job', 'time'], name='jobs_logline_job_time'),
        ),
        migrations.RunPython(ranks_forward, migrations.RunPython.noop),
        migrations.RunPython(indexes_forward, indexes_backward),
    ]
