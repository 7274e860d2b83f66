from rest_framework.permissions import BasePermission

from strata.accounts.attempt_credentials import AttemptCredential
from strata.accounts.selectors import is_node_request


class IsUser(BasePermission):
    """An authenticated person (session or user token), not a node agent."""

    def has_permission(self, request, view):
        return bool(request.user and request.user.is_authenticated and not is_node_request(request))


class IsNode(BasePermission):
    message = "A node token is required."

    def has_permission(self, request, view):
        return is_node_request(request)


class IsClusterAdmin(IsUser):
    message = "Cluster admins only."

    def has_permission(self, request, view):
        return super().has_permission(request, view) and request.user.is_staff


class IsNodeOrOwnAttempt(BasePermission):
    """A node token, or the attempt credential of the attempt the URL names, used from the node it was issued
    for (the ``node`` the call names, in its query or its body). Any other attempt's credential is a 403."""

    message = "A node token, or this attempt's own credential, is required."

    def has_permission(self, request, view):
        if is_node_request(request):
            return True
        credential = getattr(request, "auth", None)
        if not isinstance(credential, AttemptCredential):
            return False
        if str(view.kwargs.get("attempt_id")) != credential.attempt:
            self.message = "This attempt credential is for another attempt."
            return False
        node = request.query_params.get("node")
        if node is None and request.method not in ("GET", "PUT", "HEAD"):
            data = request.data
            node = data.get("node") if hasattr(data, "get") else None
        if node is not None and str(node) != credential.node:
            self.message = "This attempt credential is for another node."
            return False
        return True
