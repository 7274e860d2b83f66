"""``/api/v1/teams/{slug}/members/``: a team's members, their roles and their own limits inside the team's quota.

Every role of the team reads the list; adding, changing and removing members and setting their limits needs the
team-admin role (a cluster admin too). Another team (one the caller cannot see) is a 404. The limits live here,
over the quota layer, because they are checked against the team's quota (``max_concurrent_jobs`` and ``max_gpus``
of a member never exceed the team's) and admission reads them (``strata.quotas.services.member_limits``).
"""

from __future__ import annotations

from django.db import transaction
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from strata.accounts import members, roles
from strata.accounts.api.serializers import MemberAddSerializer, MemberChangeSerializer, MemberSerializer
from strata.accounts.models import Membership, Team
from strata.api.error_answers import error_response
from strata.api.permissions import IsUser
from strata.quotas.models import Quota


def team_ceilings(team: Team) -> dict:
    """The team's quota limits a member's own limits may not exceed (a missing quota or a null limit: none)."""
    quota = Quota.objects.filter(team=team).first()
    return {field: getattr(quota, field, None) for field in members.LIMIT_FIELDS}


def _audit(action: str, request, team: Team, target: str, before, after) -> None:
    from strata.audit.services import record

    record(action, request=request, team=team, target=target, before=before, after=after)


def _rejected(error: members.MemberRejected) -> Response:
    if error.conflict:
        return Response({"detail": str(error)}, status=status.HTTP_409_CONFLICT)
    return Response({field: [message] for field, message in error.errors.items()},
                    status=status.HTTP_400_BAD_REQUEST)


def _body(request, serializer_class) -> dict:
    """The validated body: every bad field, and every unknown one, named in one 400."""
    data = request.data if isinstance(request.data, dict) else None
    if data is None:
        raise serializers.ValidationError({"non_field_errors": ["the body must be a JSON object"]})
    serializer = serializer_class(data=data)
    errors = {} if serializer.is_valid() else dict(serializer.errors)
    allowed = set(serializer_class().fields)
    for name in list(data)[:100]:
        if name not in allowed:
            errors[str(name)[:100]] = [f"unknown field; allowed: {', '.join(sorted(allowed))}"]
    if errors:
        raise serializers.ValidationError(errors)
    return dict(serializer.validated_data)


class TeamMembersAPIView(APIView):
    permission_classes = [IsUser, roles.role_permission(roles.TEAM_ADMIN)]

    def team(self, slug: str) -> Team:
        team = Team.objects.filter(slug=slug).first()
        if team is None or roles.role_in(self.request, team) is None:
            raise Http404("no such team")
        return team


class TeamMembersView(TeamMembersAPIView):
    """``GET``: the team's members (every role). ``POST {username, role?}``: add an existing user (team-admin)."""

    @extend_schema(operation_id="team_members_list", responses={200: MemberSerializer(many=True),
                                                                404: error_response(404, "No such team.")})
    def get(self, request, slug):
        return Response([members.member_entry(m) for m in members.members_of(self.team(slug))])

    @extend_schema(operation_id="team_members_add", request=MemberAddSerializer,
                   responses={201: MemberSerializer, 400: error_response(400, "Bad fields, each named."),
                              403: error_response(403, "The team-admin role is needed."),
                              404: error_response(404, "No such team."),
                              409: error_response(409, "The user is already in the team.")})
    def post(self, request, slug):
        team = self.team(slug)
        fields = _body(request, MemberAddSerializer)
        try:
            with transaction.atomic():
                membership = members.member_add(team, fields["username"], fields["role"])
                entry = members.member_entry(membership)
                _audit("membership.add", request, team, f"user {membership.user.username}", None, entry)
        except members.MemberRejected as error:
            return _rejected(error)
        return Response(entry, status=status.HTTP_201_CREATED)


class TeamMemberView(TeamMembersAPIView):
    """``GET``: one member. ``PATCH {role?, max_concurrent_jobs?, max_gpus?}``: change their role or their own
    limits (null clears one; each at most the team's quota). ``DELETE``: remove them (their tokens of the team are
    revoked; their jobs stay). The team's last team-admin stays unless a cluster admin acts (409)."""

    def membership(self, slug: str, username: str) -> Membership:
        found = members.members_of(self.team(slug)).filter(user__username=username).first()
        if found is None:
            raise Http404(f"no member {username!r} in team {slug}")
        return found

    @extend_schema(operation_id="team_members_get", responses={200: MemberSerializer,
                                                               404: error_response(404, "No such member.")})
    def get(self, request, slug, username):
        return Response(members.member_entry(self.membership(slug, username)))

    @extend_schema(operation_id="team_members_change", request=MemberChangeSerializer,
                   responses={200: MemberSerializer, 400: error_response(400, "Bad fields, each named."),
                              403: error_response(403, "The team-admin role is needed."),
                              404: error_response(404, "No such member."),
                              409: error_response(409, "The team's last team-admin keeps the role.")})
    def patch(self, request, slug, username):
        membership = self.membership(slug, username)
        fields = _body(request, MemberChangeSerializer)
        before = members.member_entry(membership)
        try:
            with transaction.atomic():
                membership = members.member_update(membership, fields, team_ceilings(membership.team),
                                                   cluster_admin=request.user.is_staff)
                after = members.member_entry(membership)
                target = f"user {username}"
                if after["role"] != before["role"]:
                    _audit("membership.role", request, membership.team, target, {"role": before["role"]},
                           {"role": after["role"]})
                limits_before = {f: before[f] for f in members.LIMIT_FIELDS}
                limits_after = {f: after[f] for f in members.LIMIT_FIELDS}
                if limits_before != limits_after:
                    _audit("member_limits.change", request, membership.team, target, limits_before, limits_after)
        except members.MemberRejected as error:
            return _rejected(error)
        if any(field in fields for field in members.LIMIT_FIELDS):
            _admit_after_change(membership.team_id)
        return Response(after)

    @extend_schema(operation_id="team_members_remove", request=None,
                   responses={204: None, 403: error_response(403, "The team-admin role is needed."),
                              404: error_response(404, "No such member."),
                              409: error_response(409, "The team's last team-admin stays.")})
    def delete(self, request, slug, username):
        membership = self.membership(slug, username)
        before = members.member_entry(membership)
        try:
            with transaction.atomic():
                revoked = members.member_remove(membership, cluster_admin=request.user.is_staff)
                _audit("membership.remove", request, membership.team, f"user {username}", before,
                       {"tokens_revoked": revoked})
        except members.MemberRejected as error:
            return _rejected(error)
        return Response(status=status.HTTP_204_NO_CONTENT)


def _admit_after_change(team_id: int) -> None:
    """A raised (or cleared) per-user limit may let the team's PENDING jobs in now, as a raised quota does."""
    from strata.celery import request_pass
    from strata.quotas.services import admit_pending

    if admit_pending(team_id):
        transaction.on_commit(request_pass)
