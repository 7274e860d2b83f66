from django.contrib import admin

from strata.jobs.models import Attempt, Job


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    readonly_fields = ["number", "node", "fencing_token", "started_at", "ended_at", "outcome", "exit_reason"]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "owner", "kind", "state", "priority", "created_at"]
    list_filter = ["state", "kind", "team"]
    readonly_fields = ["state", "reason", "failures", "created_at", "updated_at", "started_at", "finished_at"]
    inlines = [AttemptInline]
