"""Login forms that say "too many failed logins" when the login guard refused the attempt."""

from __future__ import annotations

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from strata.accounts import login_guard


class GuardedLoginFormMixin:
    def get_invalid_login_error(self):
        if getattr(self.request, login_guard.PASSWORD_OFF_ATTR, False):
            return ValidationError(login_guard.password_off_message(), code="password_login_off")
        wait = getattr(self.request, login_guard.REFUSED_ATTR, None)
        if wait is not None:
            return ValidationError(login_guard.refusal_message(wait), code="throttled")
        return super().get_invalid_login_error()


class GuardedAuthenticationForm(GuardedLoginFormMixin, AuthenticationForm):
    pass


class GuardedAdminAuthenticationForm(GuardedLoginFormMixin, AdminAuthenticationForm):
    pass
