from django.contrib import admin

from strata.audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Read-only: the audit log is append-only (no add, change or delete, not even for superusers)."""

    list_display = ["time", "actor_name", "team_slug", "action", "target", "address"]
    list_filter = ["action"]
    search_fields = ["actor_name", "team_slug", "action", "target", "address"]
    date_hierarchy = "time"
    ordering = ["-time", "-id"]

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
