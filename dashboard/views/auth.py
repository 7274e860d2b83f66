"""Log in and out with the Django session; every other page needs a login."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.shortcuts import redirect

from dashboard.views.sso import sso_login_context
from strata.accounts.forms import GuardedAuthenticationForm


class LoginView(auth_views.LoginView):
    """Password guessing is slowed down, then locked out, by the authentication backend
    (``strata.accounts.login_guard``); a refused attempt shows how long to wait and answers 429."""

    template_name = "dashboard/login.html"
    authentication_form = GuardedAuthenticationForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        """Single sign-on's "Sign in with <provider>" when it is configured; the password form unless
        STRATA_PASSWORD_LOGIN is off (strata.accounts.oidc)."""
        context = super().get_context_data(**kwargs)
        context.update(sso_login_context(context.get(self.redirect_field_name) or ""))
        return context


class LogoutView(auth_views.LogoutView):
    next_page = "/login/"


def home(request):
    return redirect("dashboard:jobs" if request.user.is_authenticated else "dashboard:login")
