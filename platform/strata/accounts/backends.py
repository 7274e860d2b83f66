"""The password backend: Django's ModelBackend behind the login guard (``strata.accounts.login_guard``).

It is the first entry of ``AUTHENTICATION_BACKENDS`` (the other, single sign-on's ``accounts.oidc.OidcBackend``,
answers only its own callback, never a password), so every password login (the web UI's ``/login/``, the
Django admin's, DRF's ``/api-auth/login/``, any ``authenticate()`` call) is guarded here, before the password
is checked. With ``STRATA_PASSWORD_LOGIN`` off it refuses every password (single sign-on only).

Each attempt the guard lets through leaves an audit log entry: ``login.success`` or ``login.failure``, and
``login.lockout`` when the failure locks the user name or the address out. (An attempt the guard refuses leaves
none: it checks no password, and a flood of them must not flood the log.)
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.db import transaction

from strata.accounts import login_guard
from strata.audit.services import record


class GuardedModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        if not settings.STRATA_PASSWORD_LOGIN:
            if request is not None:
                setattr(request, login_guard.PASSWORD_OFF_ATTR, True)
            raise login_guard.PasswordLoginOff()  # a PermissionDenied: authenticate() stops here
        try:
            attempt = login_guard.begin(username, login_guard.client_address(request))
        except login_guard.LoginRefused as refused:
            if request is not None:
                setattr(request, login_guard.REFUSED_ATTR, refused.retry_after)
            raise  # a PermissionDenied: authenticate() stops here, without trying the password
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None:
            attempt.succeeded()
            record("login.success", request=request, actor=user, target=f"user {user.get_username()}")
            return user
        _login_failed(request, username, attempt)
        return None

    async def aauthenticate(self, request, username=None, password=None, **kwargs):
        return await sync_to_async(self.authenticate)(request, username=username, password=password, **kwargs)


def _login_failed(request, username: str, attempt: login_guard.Attempt) -> None:
    """The audit log's entries for a wrong password: ``login.failure``, and ``login.lockout`` if it locks a key."""
    User = get_user_model()
    account = User._default_manager.filter(**{User.USERNAME_FIELD: username}).first()
    actor, target = account or str(username), f"user {username}"
    with transaction.atomic():
        record("login.failure", request=request, actor=actor, target=target, after={"account": account is not None})
        if attempt.locks:
            record("login.lockout", request=request, actor=actor, target=target,
                   after={"scopes": attempt.locks, "seconds": settings.STRATA_LOGIN_LOCKOUT_SECONDS})
