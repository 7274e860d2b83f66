"""The password backend: Django's ModelBackend behind the login guard (``strata.accounts.login_guard``).

It is the only entry of ``AUTHENTICATION_BACKENDS``, so every password login (the web UI's ``/login/``, the
Django admin's, DRF's ``/api-auth/login/``, any ``authenticate()`` call) is guarded here, before the password
is checked.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend

from strata.accounts import login_guard


class GuardedModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        try:
            attempt = login_guard.begin(username, login_guard.client_address(request))
        except login_guard.LoginRefused as refused:
            if request is not None:
                setattr(request, login_guard.REFUSED_ATTR, refused.retry_after)
            raise  # a PermissionDenied: authenticate() stops here, without trying the password
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None:
            attempt.succeeded()
        return user

    async def aauthenticate(self, request, username=None, password=None, **kwargs):
        return await sync_to_async(self.authenticate)(request, username=username, password=password, **kwargs)
