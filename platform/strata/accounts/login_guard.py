"""The login guard: slows down, then locks out, password guessing (docs/security.md).

Every password login goes through ``strata.accounts.backends.GuardedModelBackend``, which calls
:func:`begin` before it checks the password. Failures are counted in the database (``LoginThrottle``), so the
limits hold across processes and restarts, under three keys:

- a user name from one client address: ``LOGIN_FREE_FAILURES`` free, then an exponential backoff, then a
  lockout of ``LOGIN_LOCKOUT_SECONDS`` from ``LOGIN_LOCKOUT_FAILURES`` on;
- a client address, any user name: the same shape with higher thresholds;
- a user name, any address: backoff only (capped), never a lockout, and an address that logged in as that user
  before (a *known* address) skips it, so a distributed attacker can slow guessing down for everyone but cannot
  shut the real user out.

An attempt made before its key allows the next one is refused without checking the password; the server never
sleeps. The attempt is charged as a failure before the password is checked, in the same transaction as the
check (the rows are locked), so parallel requests cannot all slip through on the same count; a success then
refunds the charge and clears the user name's counters for that address. Counters expire
``LOGIN_WINDOW_SECONDS`` after a key's last failure.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import random
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Case, DateTimeField, F, Q, Value, When
from django.db.models.functions import Greatest
from django.utils import timezone

from strata.accounts.models import LoginThrottle

Scope = LoginThrottle.Scope

#: The request attribute that holds the seconds to wait when the guard refused a login on that request.
REFUSED_ATTR = "strata_login_retry_after"
USERNAME_KEY_CHARS = 256
PURGE_CHANCE = 0.02  # purge expired rows on about one charged attempt in fifty


def clock() -> datetime:
    """The guard's time (tests replace it)."""
    return timezone.now()


class LoginRefused(PermissionDenied):
    """Too many failed logins: ``retry_after`` seconds until the next attempt is allowed.

    A ``PermissionDenied``, so ``django.contrib.auth.authenticate`` stops there and returns ``None``.
    """

    def __init__(self, retry_after: int):
        super().__init__(refusal_message(retry_after))
        self.retry_after = retry_after


def refusal_message(retry_after: int) -> str:
    return f"Too many failed logins; try again in {retry_after} s."


#: The request attribute set when a password login was refused because ``STRATA_PASSWORD_LOGIN`` is off.
PASSWORD_OFF_ATTR = "strata_password_login_off"


class PasswordLoginOff(PermissionDenied):
    """Password logins are turned off (``STRATA_PASSWORD_LOGIN=false``): users sign in through single sign-on."""

    def __init__(self):
        super().__init__(password_off_message())


def password_off_message() -> str:
    name = settings.STRATA_OIDC_PROVIDER_NAME if settings.STRATA_OIDC_ISSUER else ""
    where = f": sign in with {name}" if name else ""
    return f"Password login is turned off on this cluster{where}."


@dataclass(frozen=True)
class Limit:
    free: int  # failures allowed with no wait
    lockout_at: int | None  # from this many failures on, each attempt waits lockout_seconds (None: never)

    def wait(self, failures: int, *, base: float, cap: float, lockout: float) -> float:
        """Seconds the next attempt must wait after the last of ``failures`` failures."""
        if self.lockout_at is not None and failures >= self.lockout_at:
            return lockout
        if failures < self.free:
            return 0.0
        return min(base * 2 ** min(failures - self.free, 62), cap)


@dataclass(frozen=True)
class Policy:
    limits: dict[str, Limit]
    backoff_seconds: float
    backoff_max_seconds: float
    lockout_seconds: float
    window: timedelta
    known_address: timedelta

    @classmethod
    def from_settings(cls) -> Policy:
        return cls(
            limits={
                Scope.USER_ADDRESS: Limit(settings.STRATA_LOGIN_FREE_FAILURES, settings.STRATA_LOGIN_LOCKOUT_FAILURES),
                Scope.ADDRESS: Limit(settings.STRATA_LOGIN_ADDRESS_FREE_FAILURES,
                                     settings.STRATA_LOGIN_ADDRESS_LOCKOUT_FAILURES),
                Scope.USER: Limit(settings.STRATA_LOGIN_USER_FREE_FAILURES, None),
            },
            backoff_seconds=settings.STRATA_LOGIN_BACKOFF_SECONDS,
            backoff_max_seconds=settings.STRATA_LOGIN_BACKOFF_MAX_SECONDS,
            lockout_seconds=settings.STRATA_LOGIN_LOCKOUT_SECONDS,
            window=timedelta(seconds=settings.STRATA_LOGIN_WINDOW_SECONDS),
            known_address=timedelta(days=settings.STRATA_LOGIN_KNOWN_ADDRESS_DAYS),
        )

    def failures(self, row: LoginThrottle, now: datetime) -> int:
        """The row's failures still counted at ``now`` (0 once the window since the last one has passed)."""
        if row.last_failure_at is None or row.last_failure_at <= now - self.window:
            return 0
        return row.failures

    def allowed_at(self, row: LoginThrottle, now: datetime) -> datetime | None:
        """When the row's key allows its next attempt (None: now)."""
        wait = self.limits[row.scope].wait(self.failures(row, now), base=self.backoff_seconds,
                                           cap=self.backoff_max_seconds, lockout=self.lockout_seconds)
        return row.last_failure_at + timedelta(seconds=wait) if wait > 0 else None


# --- keys -------------------------------------------------------------------------------------------------


def normalize_username(username: str) -> str:
    """The guard's form of a user name: NFKC like Django's forms, case-folded (so that no database collation
    can split one account's guesses over several keys), and capped in length."""
    return unicodedata.normalize("NFKC", str(username)).casefold()[:USERNAME_KEY_CHARS]


def user_key(username: str) -> str:
    """A keyed digest of the normalized user name: what the table stores instead of the name."""
    return hmac.new(settings.SECRET_KEY.encode(), b"strata-login-guard\0" + normalize_username(username).encode(),
                    hashlib.sha256).hexdigest()


def normalize_address(value: str | None) -> str | None:
    """An IPv4 address, or the /64 network of an IPv6 address (one host usually holds a whole /64); None if
    ``value`` is not an IP address."""
    try:
        address = ipaddress.ip_address((value or "").strip())
    except ValueError:
        return None
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _ip(value: str | None) -> str | None:
    """``value`` as an IP address (an IPv4-mapped IPv6 one as IPv4), or None if it is not one."""
    try:
        address = ipaddress.ip_address((value or "").strip())
    except ValueError:
        return None
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def client_ip(request) -> str | None:
    """The client's exact IP address: REMOTE_ADDR, or with ``REST_FRAMEWORK["NUM_PROXIES"]`` = n > 0 the n-th
    address from the right of X-Forwarded-For (what the nearest trusted proxy saw). X-Forwarded-For is ignored
    when no proxies are configured, since any client can send it. (The audit log records this one.)"""
    if request is None:
        return None
    meta = request.META
    remote = _ip(meta.get("REMOTE_ADDR"))
    proxies = settings.REST_FRAMEWORK.get("NUM_PROXIES") or 0
    forwarded = meta.get("HTTP_X_FORWARDED_FOR")
    if proxies > 0 and forwarded:
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        if hops:
            return _ip(hops[-min(proxies, len(hops))]) or remote
    return remote


def client_address(request) -> str | None:
    """The guard's key for the client (:func:`client_ip`): an IPv4 address or an IPv6 /64."""
    return normalize_address(client_ip(request))


# --- the gate ---------------------------------------------------------------------------------------------


def _keys(ukey: str, address: str | None) -> list[tuple[str, str, str]]:
    keys = [(Scope.USER, ukey, "")]
    if address:
        keys += [(Scope.USER_ADDRESS, ukey, address), (Scope.ADDRESS, "", address)]
    return keys


def _key_filter(keys) -> Q:
    query = Q(pk__in=[])
    for scope, ukey, address in keys:
        query |= Q(scope=scope, user_key=ukey, address=address)
    return query


def _wait(policy: Policy, rows: list[LoginThrottle], now: datetime) -> int:
    """Whole seconds until every key of ``rows`` allows an attempt (0: now). The user name's own key is
    skipped from an address that logged in as that user within ``known_address``."""
    pair = next((row for row in rows if row.scope == Scope.USER_ADDRESS), None)
    known = bool(pair and pair.last_success_at and pair.last_success_at > now - policy.known_address)
    waits = [(allowed - now).total_seconds() for row in rows if not (row.scope == Scope.USER and known)
             for allowed in [policy.allowed_at(row, now)] if allowed is not None and allowed > now]
    return max(1, math.ceil(max(waits))) if waits else 0


def _display_name(username: str) -> str:
    User = get_user_model()
    exists = User._default_manager.filter(**{User.USERNAME_FIELD: username}).exists()
    return username[:150] if exists else ""


@dataclass
class Attempt:
    """A login attempt the guard let through and charged as a failure; call :meth:`succeeded` if the
    password was right."""

    keys: list[tuple[str, str, str]]
    charged_at: datetime
    previous: dict[str, datetime | None]  # scope -> last_failure_at before the charge
    locks: list[str] = field(default_factory=list)  # scopes this attempt locks out if it fails (for the audit log)

    def succeeded(self) -> None:
        """Refund the charge; the user name's counters for this address are cleared, and the address
        becomes a known one for that user."""
        with transaction.atomic():
            for scope, ukey, address in self.keys:
                rows = LoginThrottle.objects.filter(scope=scope, user_key=ukey, address=address)
                if scope == Scope.USER_ADDRESS:
                    rows.update(failures=0, last_failure_at=None, last_success_at=self.charged_at,
                                updated_at=self.charged_at)
                else:
                    # Put back the previous last failure unless another attempt was charged since.
                    rows.update(failures=Greatest(F("failures") - 1, Value(0)), last_failure_at=Case(
                        When(last_failure_at=self.charged_at,
                             then=Value(self.previous.get(scope), output_field=DateTimeField())),
                        default=F("last_failure_at")))


def begin(username: str, address: str | None, *, now: datetime | None = None) -> Attempt:
    """Let a password check for ``username`` from ``address`` (None: unknown, only the user name's key
    applies) go ahead and charge it as a failure, or raise :class:`LoginRefused`."""
    policy = Policy.from_settings()
    now = now or clock()
    ukey = user_key(username)
    keys = _keys(ukey, address)
    name = _display_name(username)
    with transaction.atomic():
        LoginThrottle.objects.bulk_create(
            [LoginThrottle(scope=scope, user_key=k, address=a, username=name if k else "", updated_at=now)
             for scope, k, a in keys],
            ignore_conflicts=True)
        rows = list(LoginThrottle.objects.select_for_update().filter(_key_filter(keys)).order_by("pk"))
        wait = _wait(policy, rows, now)
        if wait:
            raise LoginRefused(wait)
        previous = {}
        locks = []
        for row in rows:
            previous[row.scope] = row.last_failure_at
            row.failures = policy.failures(row, now) + 1
            lockout_at = policy.limits[row.scope].lockout_at
            if lockout_at is not None and row.failures >= lockout_at:
                locks.append(row.scope)
            row.last_failure_at = row.updated_at = now
            row.save(update_fields=["failures", "last_failure_at", "updated_at"])
    if random.random() < PURGE_CHANCE:
        purge(now=now)
    return Attempt(keys=keys, charged_at=now, previous=previous, locks=locks)


# --- housekeeping ------------------------------------------------------------------------------------------


def purge(*, now: datetime | None = None) -> int:
    """Delete rows whose failures have expired and that do not mark a known address."""
    policy = Policy.from_settings()
    now = now or clock()
    stale = LoginThrottle.objects.filter(updated_at__lt=now - policy.window).filter(
        Q(last_failure_at__isnull=True) | Q(last_failure_at__lte=now - policy.window)).filter(
        Q(last_success_at__isnull=True) | Q(last_success_at__lte=now - policy.known_address))
    deleted, _ = stale.delete()
    return deleted


def unlock(username: str | None = None, address: str | None = None) -> int:
    """Clear the failures of a user name (every address) and/or of a client address; returns the number of
    counters cleared. Known addresses are kept."""
    query = Q(pk__in=[])
    if username:
        query |= Q(user_key=user_key(username))
    if address:
        network = normalize_address(address)
        if network is None:
            raise ValueError(f"not an IP address: {address!r}")
        query |= Q(address=network)
    return LoginThrottle.objects.filter(query, failures__gt=0).update(
        failures=0, last_failure_at=None, updated_at=clock())


def wait_seconds(username: str, address: str | None, *, now: datetime | None = None) -> int:
    """Seconds until ``username`` may try from ``address`` (0: now). For display; :func:`begin` decides."""
    now = now or clock()
    rows = list(LoginThrottle.objects.filter(_key_filter(_keys(user_key(username), address))))
    return _wait(Policy.from_settings(), rows, now)


# --- responses ----------------------------------------------------------------------------------------------


class LoginGuardMiddleware:
    """Answers ``429 Too Many Requests`` with ``Retry-After`` when the guard refused a login on the request
    (``403`` when it was refused because password logins are off).

    The guard runs inside ``authenticate()``, which every login view (the web UI's, the Django admin's, DRF's
    browsable-API login) calls from its form; those views redisplay the form with a 200, so the status is
    set here, once for all of them.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        wait = getattr(request, REFUSED_ATTR, None)
        if wait is not None and response.status_code == 200:
            response.status_code = 429
            response["Retry-After"] = str(wait)
        elif getattr(request, PASSWORD_OFF_ATTR, False) and response.status_code == 200:
            response.status_code = 403  # STRATA_PASSWORD_LOGIN is off: the form says so
        return response
