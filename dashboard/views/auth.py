"""Log in and out with the Django session; every other page needs a login."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.shortcuts import redirect


class LoginView(auth_views.LoginView):
    template_name = "dashboard/login.html"
    redirect_authenticated_user = True


class LogoutView(auth_views.LogoutView):
    next_page = "/login/"


def home(request):
    return redirect("dashboard:jobs" if request.user.is_authenticated else "dashboard:login")
