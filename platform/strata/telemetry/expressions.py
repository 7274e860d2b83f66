"""Database-side time bucketing, so grouping by bucket happens in SQL on SQLite and PostgreSQL alike.

Django's ``TruncMinute``/``TruncHour`` are native on PostgreSQL but a Python user function per row on SQLite,
and they cannot express "15-second buckets from this origin". ``EpochBucket`` is plain integer arithmetic on
Unix seconds with each backend's native functions.
"""

from __future__ import annotations

from django.db import NotSupportedError
from django.db.models import BigIntegerField, Func


class EpochBucket(Func):
    """``floor((unix_seconds(expression) - origin) / width)``: the index of the ``width``-second bucket, counted
    from ``origin`` (Unix seconds), that holds each row's time. ``origin`` and ``width`` are integers, rows must
    not precede ``origin``.

    On SQLite, ``strftime('%s', ...)`` truncates to whole seconds; with an integer origin and width this gives
    exactly the same bucket as the fractional time would.
    """

    output_field = BigIntegerField()

    def __init__(self, expression, origin: int, width: int):
        if width < 1:
            raise ValueError("bucket width must be at least one second")
        super().__init__(expression)
        self.origin, self.width = int(origin), int(width)

    def as_sqlite(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"((CAST(strftime('%%s', {sql}) AS INTEGER) - %s) / %s)", [*params, self.origin, self.width]

    def as_postgresql(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        return f"FLOOR((EXTRACT(EPOCH FROM {sql}) - %s) / %s)::bigint", [*params, self.origin, self.width]

    def as_sql(self, compiler, connection, **extra):
        raise NotSupportedError(f"EpochBucket supports SQLite and PostgreSQL, not {connection.vendor}")
