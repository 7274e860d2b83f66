from rest_framework.permissions import BasePermission

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
