"""The cluster admins' device-pool editor (``/manage/pools/``): the GPU-sharing policy of each pool.

It goes through the same ``cluster.services.pool_policy_set`` as ``PATCH /api/v1/pools/<name>/``; the nodes of
a pool get the new policy in their next heartbeat answer.
"""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_http_methods

from dashboard.views.common import admin_required, page_context
from strata.cluster.models import DevicePool
from strata.cluster.services import PoolInvalid, pool_policy_set, pools_list


@admin_required
@require_http_methods(["GET", "POST"])
def pool_editor(request):
    """Every device pool with its sharing policy, editable in place."""
    if request.method == "POST":
        name = request.POST.get("pool", "")
        try:
            pool_policy_set(name, request.POST.get("sharing_policy", ""))
        except PoolInvalid as error:
            messages.error(request, f"Pool {name} not saved: {error}")
            context = page_context(request, "quotas", pools=pools_list(), policies=DevicePool.Policy.choices)
            return render(request, "dashboard/pools.html", context, status=400)
        messages.success(request, f"Pool {name} saved: its nodes switch policy at their next heartbeat")
        return redirect(f"{reverse('dashboard:pool-editor')}#pool-{name}")
    return render(request, "dashboard/pools.html",
                  page_context(request, "quotas", pools=pools_list(), policies=DevicePool.Policy.choices))


urlpatterns = [
    path("manage/pools/", pool_editor, name="pool-editor"),
]
