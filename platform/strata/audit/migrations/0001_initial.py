import django.core.serializers.json
import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

# The database refuses to change or delete an audit entry (strata.audit.models). Two changes are allowed: a
# deleted user's or team's foreign key set to NULL (on_delete=SET_NULL, every other column unchanged), and, on
# PostgreSQL, the retention collector's DELETE (its transaction sets strata.audit_retention = 'on').
KEPT = ["id", "time", "actor_name", "team_slug", "action", "target", "before", "after", "address", "user_agent"]
UNCHANGED_SQLITE = " AND ".join(f"NEW.{column} IS OLD.{column}" for column in KEPT)
ROW = "({})".format(", ".join("{0}." + column for column in KEPT))

POSTGRES_FORWARD = f"""
CREATE OR REPLACE FUNCTION audit_entry_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF current_setting('strata.audit_retention', true) = 'on' THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'audit entries are append-only: only the retention collector deletes them'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF {ROW.format("NEW")} IS NOT DISTINCT FROM {ROW.format("OLD")}
            AND (NEW.actor_id IS NULL OR NEW.actor_id = OLD.actor_id)
            AND (NEW.team_id IS NULL OR NEW.team_id = OLD.team_id) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'audit entries are append-only: they cannot be updated' USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_entry_append_only BEFORE UPDATE OR DELETE ON audit_auditentry
    FOR EACH ROW EXECUTE FUNCTION audit_entry_append_only();
"""
POSTGRES_BACKWARD = """
DROP TRIGGER IF EXISTS audit_entry_append_only ON audit_auditentry;
DROP FUNCTION IF EXISTS audit_entry_append_only();
"""
SQLITE_FORWARD = f"""
CREATE TRIGGER audit_entry_append_only BEFORE UPDATE ON audit_auditentry
FOR EACH ROW WHEN NOT ({UNCHANGED_SQLITE}
    AND (NEW.actor_id IS NULL OR NEW.actor_id IS OLD.actor_id) AND (NEW.team_id IS NULL OR NEW.team_id IS OLD.team_id))
BEGIN
    SELECT RAISE(ABORT, 'audit entries are append-only: they cannot be updated');
END;
"""
SQLITE_BACKWARD = "DROP TRIGGER IF EXISTS audit_entry_append_only;"


def _run(statements: dict[str, str]):
    def run(apps, schema_editor):
        sql = statements.get(schema_editor.connection.vendor)
        if sql:
            schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('accounts', '0004_team_secrets'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('time', models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                ('actor_name', models.CharField(blank=True, max_length=150)),
                ('team_slug', models.CharField(blank=True, max_length=64)),
                ('action', models.CharField(db_index=True, max_length=64)),
                ('target', models.CharField(blank=True, max_length=200)),
                ('before', models.JSONField(blank=True, encoder=django.core.serializers.json.DjangoJSONEncoder, null=True)),
                ('after', models.JSONField(blank=True, encoder=django.core.serializers.json.DjangoJSONEncoder, null=True)),
                ('address', models.CharField(blank=True, max_length=64)),
                ('user_agent', models.CharField(blank=True, max_length=256)),
                ('actor', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('team', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='accounts.team')),
            ],
            options={
                'verbose_name': 'audit entry',
                'verbose_name_plural': 'audit entries',
                'ordering': ['-time', '-id'],
                'indexes': [models.Index(fields=['team', 'time'], name='audit_team_time')],
            },
        ),
        migrations.RunPython(_run({"postgresql": POSTGRES_FORWARD, "sqlite": SQLITE_FORWARD}),
                             _run({"postgresql": POSTGRES_BACKWARD, "sqlite": SQLITE_BACKWARD})),
    ]
