"""The web UI's routes, mounted at the site root. Each page module owns its own ``urlpatterns``."""

from django.urls import path

from dashboard.views import (
    assets,
    audit,
    auth,
    cluster,
    compare,
    jobs,
    log_search,
    notifications,
    pools,
    sso,
    team_members,
    team_secrets,
    tracking,
    usage,
    whatif,
)

app_name = "dashboard"

urlpatterns = [
    path("", auth.home, name="home"),
    path("login/", auth.LoginView.as_view(), name="login"),
    path("logout/", auth.LogoutView.as_view(), name="logout"),
    path("assets/plotly.min.js", assets.plotly_js, name="plotly-js"),
    *jobs.urlpatterns,
    *compare.urlpatterns,
    *log_search.urlpatterns,
    *cluster.urlpatterns,
    *usage.urlpatterns,
    *whatif.urlpatterns,
    *pools.urlpatterns,
    *team_secrets.urlpatterns,
    *notifications.urlpatterns,
    *sso.urlpatterns,
    *team_members.urlpatterns,
    *tracking.urlpatterns,
    *audit.urlpatterns,
]
