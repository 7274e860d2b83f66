from django.contrib import admin

from strata.accounts.models import ApiToken, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    inlines = [MembershipInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "kind", "name", "user", "team", "expires_at", "revoked_at", "last_used_at"]
    readonly_fields = ["prefix", "digest", "created_at", "last_used_at"]
    list_filter = ["kind"]
