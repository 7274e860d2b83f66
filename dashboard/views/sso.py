"""Single sign-on in the web UI: what the login page shows, and ``/cli-login/``, where a browser session gives the
command line a token (``strata login``).

``strata login`` makes a token itself and sends only its prefix and digest, in the link it opens here. The page
shows the code the terminal shows (the digest's first eight characters), the viewer picks a team and approves; the
token is then created with that digest (``accounts.services.token_create(presented=...)``), and the command line,
which polls with its token, finds that it works. The raw token never reaches the server before it is used, and a
link approves once (the digest is unique). A viewer who is not logged in goes to the login page, or with
``sso=1`` straight to the provider.
"""

from __future__ import annotations

import re
from urllib.parse import urlencode

from django.contrib.auth.views import redirect_to_login
from django.db import IntegrityError, transaction
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.urls import path, reverse
from django.views.decorators.http import require_http_methods

from dashboard.views.common import visible_teams
from strata.accounts import oidc, services
from strata.accounts.models import ApiToken

HEX8 = re.compile(r"^[0-9a-f]{8}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
NAME_CHARS = 100


def sso_login_context(next_url: str) -> dict:
    """The login page's part: the single sign-on button (and where it goes), and whether to show the password
    form."""
    start = reverse("oidc_authentication_init")
    return {
        "sso_enabled": oidc.enabled(),
        "sso_name": oidc.provider_name(),
        "sso_url": f"{start}?{urlencode({'next': next_url})}" if next_url else start,
        "password_login": oidc.password_login(),
    }


def login_code(digest: str) -> str:
    """The code the terminal and the page both show: the digest's first eight characters, as ABCD-1234."""
    return f"{digest[:4]}-{digest[4:8]}".upper()


def _request_fields(data) -> tuple[dict, str | None]:
    """The link's fields and, when they do not make a ``strata login`` link, why."""
    fields = {key: str(data.get(key, "")).strip() for key in ("prefix", "digest", "team", "name")}
    if not HEX8.match(fields["prefix"]) or not HEX64.match(fields["digest"]):
        return fields, "This is not a complete strata login link: run strata login again and open the link it prints."
    fields["name"] = fields["name"][:NAME_CHARS] or "strata login"
    return fields, None


@require_http_methods(["GET", "POST"])
def cli_login(request):
    data = request.POST if request.method == "POST" else request.GET
    if not request.user.is_authenticated:
        if request.method == "GET" and data.get("sso") == "1" and oidc.enabled():
            start = reverse("oidc_authentication_init")
            return HttpResponseRedirect(f"{start}?{urlencode({'next': request.get_full_path()})}")
        return redirect_to_login(request.get_full_path())
    fields, problem = _request_fields(data)
    teams = list(visible_teams(request))
    context = {"section": "", "fields": fields, "problem": problem, "teams": teams, "approved": None,
               "code": login_code(fields["digest"]) if problem is None else ""}
    if problem is None and ApiToken.objects.filter(digest=fields["digest"]).exists():
        context["problem"] = "This link was approved already: the command line has its token."
    elif problem is None and not teams:
        context["problem"] = "You belong to no team yet, so there is no token to give: ask a cluster admin."
    elif problem is None and request.method == "POST":
        team = next((team for team in teams if team.slug == fields["team"]), None)
        if team is None:
            context["problem"] = "Pick one of your teams."
        else:
            try:
                with transaction.atomic():
                    token, _ = services.token_create(request.user, team=team, name=fields["name"], request=request,
                                                     presented=(fields["prefix"], fields["digest"]))
            except services.TokenRefused as refused:
                context["problem"] = refused.message
            except IntegrityError:
                context["problem"] = "This link was approved already: the command line has its token."
            else:
                context["approved"] = token
    return render(request, "dashboard/cli_login.html", context)


urlpatterns = [
    path("cli-login/", cli_login, name="cli-login"),
]
