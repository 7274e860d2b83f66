from django.contrib import admin

from strata.accounts.forms import GuardedAdminAuthenticationForm
from strata.accounts.models import ApiToken, LoginThrottle, Membership, Team

# The admin's login says "too many failed logins" when the login guard refuses (the guard itself runs in the
# authentication backend, for every login form).
admin.site.login_form = GuardedAdminAuthenticationForm


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


@admin.register(LoginThrottle)
class LoginThrottleAdmin(admin.ModelAdmin):
    """Failed-login counters. Deleting a row clears that lockout (so does ``strata user unlock``)."""

    list_display = ["scope", "username", "address", "failures", "last_failure_at", "last_success_at"]
    list_filter = ["scope"]
    search_fields = ["username", "address"]
    ordering = ["-last_failure_at"]
    readonly_fields = ["scope", "user_key", "address", "username", "failures", "last_failure_at",
                       "last_success_at", "updated_at"]

    def has_add_permission(self, request):
        return False
