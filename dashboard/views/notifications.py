"""A team's notifications (``/team/notifications/``), among the team's settings next to Secrets and Members:
its webhooks (create, with the signing secret shown this once; enable or disable; send a test; delete), its
e-mail subscriptions, and the latest deliveries with their status, tries, answer code and error.

Team-admins (and cluster admins) only, through the same ``strata.notify.services`` as ``/api/v1/webhooks/``;
another team is a 404, a team the viewer sees without the team-admin role a 403.
"""

from __future__ import annotations

from django.contrib import messages
from django.db import transaction
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods

from dashboard.views.common import login_required, page_context, visible_teams
from strata.accounts import roles
from strata.notify import services
from strata.notify.models import EVENTS, Delivery, EmailSubscription, Webhook

RECENT = 30


def _team(request):
    """The page's team: ``?team=slug`` (one the viewer can see; any other is a 404), else the first where the
    viewer is a team-admin, else the first."""
    teams = list(visible_teams(request))
    slug = request.GET.get("team") or (request.POST.get("team") if request.method == "POST" else None)
    if slug:
        team = next((candidate for candidate in teams if candidate.slug == slug), None)
        if team is None:
            raise Http404("no such team")
        return team, teams
    admin = next((team for team in teams if roles.has_role(request, team, roles.TEAM_ADMIN)), None)
    return admin or (teams[0] if teams else None), teams


def _page(request, team, teams, *, errors=None, form=None, secret=None, status: int = 200):
    context = page_context(
        request, "notifications", team=team, member_teams=teams, events=EVENTS, formats=Webhook.Format.values,
        webhooks=Webhook.objects.filter(team=team).order_by("id") if team else [],
        emails=EmailSubscription.objects.filter(team=team).order_by("address") if team else [],
        deliveries=(Delivery.objects.filter(team=team).select_related("webhook", "email")
                    .order_by("-created_at", "-id")[:RECENT]) if team else [],
        errors=errors or {}, form=form or {"events": list(EVENTS), "format": "json"}, secret=secret)
    return render(request, "dashboard/notifications.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def notifications_page(request):
    team, teams = _team(request)
    if team is not None:
        roles.require_page(request, team, roles.TEAM_ADMIN, "manage its notifications")
    if request.method == "GET" or team is None:
        return _page(request, team, teams)
    here = f"{reverse('dashboard:team-notifications')}?{urlencode({'team': team.slug})}"
    action = request.POST.get("action", "")
    if action == "create":
        form = {"url": request.POST.get("url", "").strip(), "format": request.POST.get("format", "json"),
                "events": request.POST.getlist("events")}
        try:
            with transaction.atomic():
                hook, secret = services.webhook_create(team, url=form["url"], format=form["format"],
                                                       events=form["events"], user=request.user)
                services.audit("webhook.create", request=request, team=team, target=f"webhook {hook.pk}",
                               after={"url": hook.url, "format": hook.format, "events": hook.events,
                                      "enabled": hook.enabled})
        except services.NotifyRejected as error:
            messages.error(request, "Webhook not created: check the highlighted fields.")
            return _page(request, team, teams, errors=error.errors, form=form, status=400)
        messages.success(request, f"Webhook {hook.pk} created: copy its signing secret now, it is not shown again")
        return _page(request, team, teams, secret={"webhook": hook.pk, "value": secret}, status=201)
    if action == "subscribe":
        address = request.POST.get("address", "").strip()
        try:
            services.email_create(team, address=address, events=request.POST.getlist("events") or None,
                                  user=request.user)
        except services.NotifyRejected as error:
            messages.error(request, "; ".join(error.errors.values()))
            return _page(request, team, teams, status=400)
        messages.success(request, f"{address} subscribed")
        return redirect(here)
    target = _target(team, request.POST.get("target", ""))
    if action == "test":
        delivery = services.send_test(target)
        messages.success(request, f"Test notification queued (delivery {delivery.pk}): its outcome shows below")
    elif action in ("enable", "disable"):
        target.enabled = action == "enable"
        target.save(update_fields=["enabled"])
        messages.success(request, f"{_name(target)} {action}d")
    elif action == "delete":
        with transaction.atomic():
            pk = target.pk
            target.delete()
            if isinstance(target, Webhook):
                services.audit("webhook.delete", request=request, team=team, target=f"webhook {pk}",
                               before={"url": target.url, "format": target.format, "events": target.events})
        messages.success(request, f"{_name(target)} deleted")
    else:
        raise Http404("no such action")
    return redirect(here)


def _target(team, value: str) -> Webhook | EmailSubscription:
    """``webhook:<id>`` or ``email:<id>`` of the team; anything else a 404."""
    kind, _, pk = value.partition(":")
    model = {"webhook": Webhook, "email": EmailSubscription}.get(kind)
    found = model.objects.filter(team=team, pk=int(pk)).first() if model and pk.isdigit() else None
    if found is None:
        raise Http404("no such notification target")
    return found


def _name(target) -> str:
    return f"Webhook {target.pk}" if isinstance(target, Webhook) else f"E-mail subscription {target.address}"


urlpatterns = [
    path("team/notifications/", notifications_page, name="team-notifications"),
]
