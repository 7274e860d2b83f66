"""Writes for users, teams and tokens."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from strata.accounts import signals
from strata.accounts.models import ApiToken, Membership, Team, token_digest
from strata.audit.services import record


@transaction.atomic
def team_create(slug: str, name: str | None = None) -> Team:
    """The team ``slug`` (created if new); ``signals.team_created`` gives it what the layers above keep per team
    (its quota)."""
    team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    signals.team_created.send(sender=Team, team=team)
    return team


def membership_set(user, team: Team, role: str = Membership.Role.MEMBER) -> Membership:
    membership, _ = Membership.objects.update_or_create(user=user, team=team, defaults={"role": role})
    return membership


def user_create(username: str, password: str | None = None, *, admin: bool = False, email: str = ""):
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is None:
        user = User.objects.create_user(username=username, email=email, password=password)
    elif password:
        user.set_password(password)
    user.is_staff = user.is_superuser = admin
    user.save()
    return user


class TokenRefused(ValueError):
    """A token may not be created as asked; ``field`` names the part of the request at fault (a 400)."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(message)


def token_create(user, *, team: Team | None = None, kind: str = ApiToken.Kind.USER, name: str = "",
                 ttl_days: float | None = None, parent: ApiToken | None = None, request=None,
                 actor=None, presented: tuple[str, str] | None = None) -> tuple[ApiToken, str]:
    """Create a token and return it with its raw value, which is never stored and cannot be shown again.

    ``parent`` is the token that asks for this one (a request authenticated by a bearer token). Such a
    request may only create a user token of the parent's own team that expires no later than the parent;
    the child is revoked with its parent. Node tokens are created only by cluster admins, never through a
    token: from a browser session or ``strata token create --local``.

    The audit log gets a ``token.create`` (``node_token.create``) entry: by ``actor``, else the request's user,
    else ``user``.

    ``presented`` is ``(prefix, digest)`` of a token made by the client that will hold it (``strata login``, which
    polls with it until it works): the token is created with that digest, and the raw value returned is "".
    """
    if parent is not None:
        if kind != ApiToken.Kind.USER:
            raise TokenRefused("kind", "node tokens are created by cluster admins from a browser session or "
                                       "`strata token create --local`, never with an API token")
        if team is None or team.pk != parent.team_id:
            raise TokenRefused("team", "a token can only create tokens of its own team")
    if kind == ApiToken.Kind.USER:
        if team is None:
            raise TokenRefused("team", "a user token must be scoped to a team")
        if not user.is_staff and not Membership.objects.filter(user=user, team=team).exists():
            raise TokenRefused("team", f"{user} is not a member of team {team.slug}")
    elif not user.is_staff:
        raise TokenRefused("kind", "only cluster admins can create node tokens")
    now = timezone.now()
    expires_at = now + timedelta(days=settings.STRATA_TOKEN_TTL_DAYS if ttl_days is None else ttl_days)
    if parent is not None and expires_at > parent.expires_at:
        if ttl_days is not None:
            raise TokenRefused("ttl_days", "a token cannot create a token that outlives it: this token expires at "
                                           f"{parent.expires_at.isoformat(timespec='seconds')}")
        expires_at = parent.expires_at
    if presented is not None:  # (prefix, digest) of a token its holder made (strata login): no raw value here
        prefix, digest, raw = presented[0], presented[1], ""
    else:
        prefix, raw = ApiToken.generate()
        digest = token_digest(raw)
    with transaction.atomic():
        token = ApiToken.objects.create(
            kind=kind, name=name, prefix=prefix, digest=digest, user=user,
            team=team if kind == ApiToken.Kind.USER else None, parent=parent, expires_at=expires_at,
        )
        record(f"{_token_action(token)}.create", request=request, actor=actor or (None if request else user),
               team=token.team, target=f"token {prefix}", after=_token_audit(token))
    return token, raw


def _token_action(token: ApiToken) -> str:
    return "node_token" if token.kind == ApiToken.Kind.NODE else "token"


def _token_audit(token: ApiToken) -> dict:
    """What the audit log keeps of a token (never its value or digest)."""
    return {"id": str(token.pk), "kind": token.kind, "name": token.name, "user": token.user.get_username(),
            "expires_at": token.expires_at, "parent": str(token.parent_id) if token.parent_id else None,
            "revoked_at": token.revoked_at}


@transaction.atomic
def token_revoke(token: ApiToken, *, request=None, actor=None) -> int:
    """Revoke ``token`` and every token created through it, however deep. Returns how many were revoked.
    The audit log gets one ``token.revoke`` (``node_token.revoke``) entry, naming how many went with it."""
    now = timezone.now()
    before = _token_audit(token)
    ids, frontier = [token.pk], [token.pk]
    while frontier:
        frontier = list(ApiToken.objects.filter(parent_id__in=frontier).values_list("pk", flat=True))
        ids.extend(frontier)
    revoked = ApiToken.objects.filter(pk__in=ids, revoked_at__isnull=True).update(revoked_at=now)
    record(f"{_token_action(token)}.revoke", request=request, actor=actor, team=token.team,
           target=f"token {token.prefix}", before=before,
           after={**before, "revoked_at": now if revoked else before["revoked_at"], "revoked": revoked})
    from strata.accounts import node_tokens

    node_tokens.forget_all()  # this process's cached node tokens; other processes' within their TTL
    transaction.on_commit(node_tokens.forget_all)  # and whatever a concurrent request cached before the commit
    return revoked
