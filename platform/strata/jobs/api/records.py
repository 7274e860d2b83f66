"""``/api/v1/{collection}/``: the plugins' collections of named, team-owned records
(:mod:`components.runtime.contract.collections`): list, register, read and delete.

A registration is checked by the collection's ``validate`` and then its ``access_problems`` (and stored as its
``resolve`` answers), with the
:class:`~components.runtime.contract.collections.RecordContext` that :attr:`CollectionView.record_context` builds for the
team: the URL map hands in the control plane's (``strata.quotas.roots.record_context``: the team's data roots),
which this layer does not import; a view without one refuses every path and knows no uploaded data set."""

from __future__ import annotations

import json
import logging

from django.db import IntegrityError, transaction
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from strata.accounts.selectors import visible_team_ids
from strata.api.error_answers import error_response
from strata.api.permissions import IsUser
from strata.jobs.models import PluginRecord
from strata.jobs.selectors import SubmitTeamError, require_submitter, submit_team

log = logging.getLogger(__name__)

COLLECTION = OpenApiParameter("collection", str, OpenApiParameter.PATH,
                              description="A plugin's collection (strata plugins lists them), e.g. datasets.")


def _collection(name: str):
    from components.runtime.contract import registry

    collection = registry.collections().get(name)
    if collection is None:  # answered like any URL that matches no route
        raise Http404()
    return collection


def _access_errors(collection, record: dict, context) -> dict[str, list[str]]:
    """The collection's ``access_problems`` of a valid record, as API errors (field -> [one line])."""
    problems = collection.access_problems(dict(record), context) or {}
    return {str(field): [" ".join(str(message).split())] for field, message in problems.items()}


def _shown(record: PluginRecord) -> dict:
    return {**record.body, "name": record.name, "team": record.team.slug, "builtin": False,
            "created_at": record.created_at.isoformat(),
            "created_by": record.created_by.username if record.created_by else None}


def _present(collection, items: list[dict], team_ids: list[int]) -> list[dict]:
    """Each item as its collection shows it (live facts added); an item whose presentation fails is shown as
    stored, and the failure is logged."""
    from strata.jobs.panel_data import DatabasePanelData

    data = DatabasePanelData(team_ids)
    shown = []
    for item in items:
        try:
            answer = json.loads(json.dumps(collection.present(dict(item), data), allow_nan=False, default=str))
        except Exception:
            log.exception("collection %s: present() failed for %s", collection.name, item.get("name"))
            answer = item
        shown.append(answer)
    return shown


class CollectionView(APIView):
    """``GET``: the collection's built-ins and the records of the viewer's teams. ``POST``: register a record for
    a team (``team``: a slug, as for jobs); every bad field at once is a 400, a taken name a 409."""

    permission_classes = [IsUser]
    record_context = None
    """team -> :class:`~components.runtime.contract.collections.RecordContext`, given by the URL map
    (``CollectionView.as_view(record_context=...)``); None refuses every path a record names."""

    def _context(self, team):
        from components.runtime.contract.collections import StaticRecordContext

        if self.record_context is None:  # fail closed: no roots granted, so every path is refused
            return StaticRecordContext(team=team.slug)
        return self.record_context(team)

    @extend_schema(operation_id="collection_list", parameters=[COLLECTION],
                   responses={200: OpenApiTypes.OBJECT, 404: error_response(404, "No such collection.")})
    def get(self, request, collection):
        found = _collection(collection)
        team_ids = visible_team_ids(request)
        items = [{**item, "team": None, "builtin": True} for item in found.builtins()]
        records = PluginRecord.objects.filter(collection=collection, team_id__in=team_ids)
        items += [_shown(record) for record in records.select_related("team", "created_by")]
        answer = {"collection": collection, "title": found.title, "results": _present(found, items, team_ids)}
        try:
            from strata.jobs.panel_data import DatabasePanelData

            summary = found.summary(DatabasePanelData(team_ids))
            if summary is not None:
                answer["summary"] = json.loads(json.dumps(summary, allow_nan=False, default=str))
        except Exception:
            log.exception("collection %s: summary() failed", collection)
        return Response(answer)

    @extend_schema(operation_id="collection_create", parameters=[COLLECTION], request=OpenApiTypes.OBJECT,
                   responses={201: OpenApiTypes.OBJECT, 400: error_response(400, "Bad fields, each named."),
                              404: error_response(404, "No such collection."),
                              409: error_response(409, "The team already has a record of that name.")})
    def post(self, request, collection):
        from components.runtime.contract.collections import name_problem
        from components.runtime.contract.spec import SpecError

        found = _collection(collection)
        body = request.data
        if not isinstance(body, dict):
            raise serializers.ValidationError({"non_field_errors": ["the body must be a JSON object"]})
        body = dict(body)
        require_submitter(request, body.get("team"))
        errors: dict[str, list[str]] = {}
        team = None
        try:
            team = submit_team(request, body.pop("team", None))
        except SubmitTeamError as error:
            errors["team"] = [str(error)]
        record = None
        try:
            record = found.validate(body)
        except SpecError as error:
            errors.update({field: [message] for field, message in error.errors.items()})
        if record is not None and (problem := name_problem(record.get("name"))):
            errors["name"] = [problem]
        if record is not None and team is not None:
            # May this team use what the record names (a path on the nodes under its data roots, say)?
            errors.update(_access_errors(found, record, self._context(team)))
        if not errors:
            # What the record names of the team's pinned to what it names now (an uploaded data set's digest).
            try:
                record = {**found.resolve(dict(record), self._context(team)), "name": record["name"]}
            except SpecError as error:
                errors.update({field: [message] for field, message in error.errors.items()})
        if errors:
            raise serializers.ValidationError(errors)
        name = record.pop("name")
        if any(item.get("name") == name for item in found.builtins()):
            return Response({"detail": f"{name!r} is a built-in {collection} entry: pick another name"},
                            status=status.HTTP_409_CONFLICT)
        try:
            with transaction.atomic():
                created = PluginRecord.objects.create(collection=collection, team=team, name=name, body=record,
                                                      created_by=request.user)
        except IntegrityError:
            return Response({"detail": f"team {team.slug} already has a {collection} entry named {name!r}"},
                            status=status.HTTP_409_CONFLICT)
        return Response(_present(found, [_shown(created)], visible_team_ids(request))[0],
                        status=status.HTTP_201_CREATED)


class CollectionItemView(APIView):
    """``GET``: one built-in or one record of the viewer's teams (``team`` narrows a name several of them
    have). ``DELETE``: remove a team's record. Another team's record is a 404."""

    permission_classes = [IsUser]

    def _record(self, request, collection: str, name: str) -> PluginRecord | None:
        team_ids = visible_team_ids(request)
        records = PluginRecord.objects.filter(collection=collection, name=name, team_id__in=team_ids)
        if slug := request.query_params.get("team"):
            records = records.filter(team__slug=slug)
        return records.select_related("team", "created_by").order_by("team__slug").first()

    @extend_schema(operation_id="collection_read",
                   parameters=[COLLECTION, OpenApiParameter("name", str, OpenApiParameter.PATH),
                               OpenApiParameter("team", str, description="The team whose record (a slug).")],
                   responses={200: OpenApiTypes.OBJECT, 404: error_response(404, "No such record.")})
    def get(self, request, collection, name):
        found = _collection(collection)
        builtin = next((item for item in found.builtins() if item.get("name") == name), None)
        if builtin is not None:
            item = {**builtin, "team": None, "builtin": True}
        else:
            record = self._record(request, collection, name)
            if record is None:
                raise Http404(f"no such entry in {collection} (built in or your team's)")
            item = _shown(record)
        return Response(_present(found, [item], visible_team_ids(request))[0])

    @extend_schema(operation_id="collection_delete",
                   parameters=[COLLECTION, OpenApiParameter("name", str, OpenApiParameter.PATH),
                               OpenApiParameter("team", str, description="The team whose record (a slug).")],
                   responses={204: None, 400: error_response(400, "A built-in cannot be deleted."),
                              404: error_response(404, "No such record.")})
    def delete(self, request, collection, name):
        found = _collection(collection)
        if any(item.get("name") == name for item in found.builtins()):
            raise serializers.ValidationError({"name": [f"{name!r} is built in: it cannot be deleted"]})
        record = self._record(request, collection, name)
        if record is None:
            raise Http404(f"no such entry in {collection} (built in or your team's)")
        from strata.accounts import roles

        roles.require_manage(request, record.team, record.created_by_id, "delete this record")
        record.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)

