"""The submit page: a form generated from a kind's JSON Schema, the YAML/JSON editor, and the one validation
path both share with the REST API.

Nothing here validates a job by itself. The form only turns its inputs into the same document a
``strata submit`` file or a ``POST /api/v1/jobs/`` body holds; :func:`validate_submission` then runs
:class:`~strata.jobs.api.serializers.JobSubmitSerializer` and :func:`~strata.jobs.selectors.submit_team` on it,
exactly as the API does, so a value is accepted or refused with the same message everywhere.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

import yaml
from django.conf import settings

from components.runtime.contract.registry import get_kind
from strata.api.values import value_problems
from strata.jobs.api.serializers import SUBMIT_FIELDS, JobSubmitSerializer
from strata.jobs.selectors import SubmitTeamError, submit_team

MAX_DOCUMENT_CHARS = 256 * 1024
MAX_DOCUMENT_DEPTH = 32
# Envelope defaults of JobSubmitSerializer, left out of the generated YAML so the file stays short.
ENVELOPE_DEFAULTS = {"priority": 0, "max_attempts": 3}
NONCE = re.compile(r"^[0-9a-f]{32}$")


# --- form fields -------------------------------------------------------------------------------------------

@dataclass
class FormField:
    """One control of the submit form. ``name`` is the submit document's dotted path (``spec.epochs``), which
    is also the key the serializer reports errors under."""

    name: str
    label: str
    control: str  # "select" | "number" | "checkbox" | "text" | "json"
    help: str = ""
    choices: list[tuple[str, str]] = field(default_factory=list)
    value: str = ""
    placeholder: str = ""
    minimum: Any = None
    maximum: Any = None
    step: str = ""
    max_length: int | None = None
    value_type: str = "string"  # how a text value becomes JSON: "string" | "integer" | "number"
    choice_values: dict[str, Any] = field(default_factory=dict)
    checked: bool = False
    error: str = ""

    @property
    def dom_id(self) -> str:
        return "field-" + re.sub(r"[^A-Za-z0-9_-]", "-", self.name)


def _types(prop: dict) -> list[str]:
    kind = prop.get("type", "string")
    return list(kind) if isinstance(kind, list) else [kind]


def _label(name: str, prop: dict) -> str:
    if prop.get("title"):
        return prop["title"]
    # "lr" reads better as "LR" than as "Lr": short names are abbreviations.
    return name.upper() if len(name) <= 3 else name.replace("_", " ").capitalize()


def _required_names(schema: dict) -> set[str]:
    """Properties the schema requires, or its first ``oneOf`` alternative requires: enums among them start on
    their first choice (e.g. a workload field starts on its first workload)."""
    names = set(schema.get("required", []))
    alternatives = schema.get("oneOf") or schema.get("anyOf") or []
    if alternatives and isinstance(alternatives[0], dict):
        names |= set(alternatives[0].get("required", []))
    return names


def _display(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def spec_fields(schema: dict) -> list[FormField]:
    """One control per property of a kind's JSON Schema, named ``spec.<property>``."""
    fields = []
    required = _required_names(schema)
    for name, prop in (schema.get("properties") or {}).items():
        types = _types(prop)
        nullable = "null" in types or None in prop.get("enum", [])
        entry = FormField(name=f"spec.{name}", label=_label(name, prop), control="text",
                          help=prop.get("description", ""))
        default = prop.get("default")
        if "enum" in prop:
            entry.control = "select"
            options = [value for value in prop["enum"] if value is not None]
            entry.choice_values = {_display(value): value for value in options}
            entry.choices = [(_display(value), _display(value)) for value in options]
            if nullable or default is None:
                entry.choices.insert(0, ("", "—"))
            if default is not None:
                entry.value = _display(default)
            elif name in required and options:
                entry.value = _display(options[0])
        elif "boolean" in types:
            entry.control = "checkbox"
            entry.checked = bool(default)
        elif "integer" in types or "number" in types:
            entry.control = "number"
            entry.value_type = "integer" if "integer" in types else "number"
            entry.step = "1" if entry.value_type == "integer" else "any"
            entry.minimum = prop.get("minimum", prop.get("exclusiveMinimum"))
            entry.maximum = prop.get("maximum", prop.get("exclusiveMaximum"))
            entry.value = _display(default)
            entry.placeholder = "default" if default is None and nullable else ""
        elif "object" in types or "array" in types:
            entry.control = "json"
            entry.placeholder = json.dumps(default if default is not None else {})
        else:
            entry.max_length = prop.get("maxLength")
            entry.value = _display(default)
            entry.placeholder = "optional" if nullable else ""
        fields.append(entry)
    return fields


def common_fields(kind: str, teams, default_team: str | None) -> list[FormField]:
    """The envelope every kind shares: name, team, priority, attempts, time limit and resources."""
    max_time = settings.STRATA_MAX_TIME_LIMIT_SECONDS
    team_choices = [(team.slug, team.name if team.name and team.name != team.slug else team.slug) for team in teams]
    team_field = FormField(name="team", label="Team", control="select", choices=team_choices,
                           value=default_team or "", help="The team whose quota the job uses.")
    if default_team is None:
        team_field.choices.insert(0, ("", "— choose a team —"))
    return [
        FormField(name="name", label="Name", control="text", placeholder=f"{kind}-job", max_length=200,
                  help="A label for lists and logs; need not be unique."),
        team_field,
        FormField(name="code", label="Code bundle", control="text", placeholder="digest of an uploaded bundle",
                  max_length=71, help="Your project: the digest of a bundle already uploaded (strata code list), "
                  "or upload a zip or tar of the project directory below. Empty: built-in code only."),
        FormField(name="priority", label="Priority", control="number", value_type="integer", step="1",
                  minimum=-100, maximum=100, value="0",
                  help="-100 to 100. Higher runs first and may preempt lower-priority jobs."),
        FormField(name="max_attempts", label="Max attempts", control="number", value_type="integer", step="1",
                  minimum=1, maximum=20, value="3",
                  help="Failures allowed before the job is FAILED (preemption and lost nodes do not count)."),
        FormField(name="time_limit", label="Time limit", control="text", placeholder="1h",
                  help=f"Per attempt: seconds or 90s, 15m, 2h. Default 1h, at most {format_duration(max_time)}."),
        FormField(name="resources.gpus", label="GPUs", control="number", value_type="number",
                  step="any", minimum=0, maximum=64, placeholder="1",
                  help="Per worker. A fraction (0.5) shares a device; above 1, whole GPUs. Default 1, or 0 "
                       "with GPU memory. 0 alone: no GPU, the job runs on a node's CPUs."),
        FormField(name="resources.gpu_memory", label="GPU memory", control="text", placeholder="e.g. 2GiB",
                  help="Per worker. Reserves device memory; alone, it sizes a shared slice of a GPU."),
        FormField(name="resources.cpus", label="CPUs", control="number", value_type="number", step="any",
                  minimum=0.001, maximum=4096, placeholder="1 with 0 GPUs",
                  help="Per worker. CPUs reserved on the node: default 1 for a job with 0 GPUs, none for a GPU "
                       "job that leaves it empty."),
        FormField(name="resources.memory", label="Memory", control="text", placeholder="e.g. 4GiB",
                  help="Per worker. Host memory reserved with the CPUs; empty: none reserved."),
        FormField(name="resources.workers", label="Workers", control="number", value_type="integer", step="1",
                  minimum=1, maximum=256, placeholder="1",
                  help="Processes placed together (gang scheduling), each with the GPUs above."),
    ]


def build_form(kind: str, teams, default_team: str | None, post=None, errors=None) -> dict[str, Any]:
    """The submit form of ``kind``: ``{"common": [...], "spec": [...], "other_errors": {...}}``, holding the
    posted values and each error next to its field when re-rendered."""
    common = common_fields(kind, teams, default_team)
    spec = spec_fields(get_kind(kind).json_schema())
    errors = dict(errors or {})
    for entry in [*common, *spec]:
        if post is not None:
            if entry.control == "checkbox":
                entry.checked = entry.name in post
            else:
                entry.value = post.get(entry.name, "")
        entry.error = errors.pop(entry.name, "")
    return {
        "common": common,
        "job": [entry for entry in common if not entry.name.startswith("resources.")],
        "resources": [entry for entry in common if entry.name.startswith("resources.")],
        "spec": spec,
        "resources_error": errors.pop("resources", ""),
        "other_errors": errors,
    }


def _number(text: str) -> Any:
    """A number from a form input; text that is no finite number passes through for the validator to name."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def document_from_post(kind: str, post) -> tuple[dict[str, Any], dict[str, str]]:
    """The submit document a POSTed form describes, and the errors only the form can have (bad JSON text).

    Empty inputs are left out, so the kind's and the envelope's defaults apply exactly as for a file that
    omits them.
    """
    document: dict[str, Any] = {"kind": kind}
    errors: dict[str, str] = {}
    for entry in [*common_fields(kind, [], None), *spec_fields(get_kind(kind).json_schema())]:
        if entry.control == "checkbox":
            value: Any = entry.name in post
        else:
            text = post.get(entry.name, "")
            text = text.strip() if isinstance(text, str) else text
            if text == "":
                continue
            if entry.control == "select":
                value = entry.choice_values.get(text, text)
            elif entry.control == "number":
                value = _number(text)
            elif entry.control == "json":
                try:
                    value = json.loads(text, parse_constant=_reject_constant)
                except (ValueError, RecursionError) as error:
                    errors[entry.name] = f"invalid JSON: {error}"
                    continue
            else:
                value = text
        target = document
        *parents, leaf = entry.name.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    return document, errors


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


# --- the editor's documents --------------------------------------------------------------------------------

class _NoAliasLoader(yaml.SafeLoader):
    """YAML without anchors and aliases: a few nested aliases expand into gigabytes once serialized."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed", event.start_mark)
        return super().compose_node(parent, index)


class DocumentError(ValueError):
    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.line, self.column = line, column
        where = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(f"{where}{message}")


def parse_document(text: str) -> dict[str, Any]:
    """A job document from YAML or JSON text (the shape of a ``strata submit`` file); :class:`DocumentError`
    with the line and column of the first problem otherwise."""
    if not isinstance(text, str):
        raise DocumentError("the document must be YAML or JSON text")
    if not text.strip():
        raise DocumentError("the document is empty: give at least 'kind' and 'spec'")
    if len(text) > MAX_DOCUMENT_CHARS:
        raise DocumentError(f"the document is longer than {MAX_DOCUMENT_CHARS} characters")
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except json.JSONDecodeError as error:
            raise DocumentError(f"invalid JSON: {error.msg}", error.lineno, error.colno) from None
        except (ValueError, RecursionError) as error:
            raise DocumentError(f"invalid JSON: {error}") from None
    else:
        try:
            data = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            problem = getattr(error, "problem", None) or str(error).strip().splitlines()[0]
            if mark is not None:
                raise DocumentError(f"invalid YAML: {problem}", mark.line + 1, mark.column + 1) from None
            raise DocumentError(f"invalid YAML: {problem}") from None
        except RecursionError:
            raise DocumentError("the document is nested too deeply") from None
        except ValueError as error:  # an integer too long to convert (Python's 4300-digit limit)
            raise DocumentError(f"invalid YAML: a number is out of range ({str(error).split(':')[0]})") from None
    if not isinstance(data, dict):
        raise DocumentError("the document must be a mapping with at least 'kind' and 'spec'")
    _check_json_values(data, "", 0)
    if problems := value_problems(data):
        raise DocumentError("; ".join(f"{field}: {message}" for field, message in problems.items()))
    return data


def _check_json_values(value: Any, path: str, depth: int) -> None:
    """Only what a JSON body could hold: string keys, finite numbers, no dates or binary."""
    where = path or "the document"
    if depth > MAX_DOCUMENT_DEPTH:
        raise DocumentError(f"{where} is nested more than {MAX_DOCUMENT_DEPTH} levels deep")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise DocumentError(f"{where}: keys must be strings, got {key!r}")
            _check_json_values(item, f"{path}.{key}" if path else key, depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json_values(item, f"{path}[{index}]", depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise DocumentError(f"{where}: NaN and infinity are not JSON values")
    elif isinstance(value, datetime | date):
        raise DocumentError(f"{where}: a date is not a JSON value; quote it")
    elif value is not None and not isinstance(value, str | int | float | bool):
        raise DocumentError(f"{where}: {type(value).__name__} is not a JSON value")


# --- validation, shared with the API -----------------------------------------------------------------------

@dataclass
class Submission:
    """A validated (or refused) submit document."""

    document: dict[str, Any]
    errors: dict[str, str]
    data: dict[str, Any] | None = None  # validated, without team: what jobs.services.job_submit takes
    team: Any = None

    @property
    def valid(self) -> bool:
        return not self.errors

    def normalized(self) -> dict[str, Any] | None:
        if not self.valid:
            return None
        return {**self.data, "team": self.team.slug}


def flatten_errors(detail: Any, prefix: str = "") -> dict[str, str]:
    """DRF's ``{field: [messages]}`` as ``{field: "message; message"}``."""
    if isinstance(detail, dict):
        flat: dict[str, str] = {}
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict):
                flat.update(flatten_errors(value, name))
            else:
                flat[name] = "; ".join(str(item) for item in (value if isinstance(value, list) else [value]))
        return flat
    messages = detail if isinstance(detail, list) else [detail]
    return {prefix or "non_field_errors": "; ".join(str(item) for item in messages)}


def validate_submission(request, document: dict[str, Any], form_errors: dict[str, str] | None = None) -> Submission:
    """Validate a submit document as ``POST /api/v1/jobs/`` does: the serializer, then the team.

    The serializer stops at its first failing stage (a bad ``time_limit`` hides a bad ``spec``; bad
    ``resources`` hide it too); a form should show every problem at once. So the serializer runs again without
    the fields that failed, until nothing new turns up, and the team is checked anyway.
    """
    errors = dict(form_errors or {})
    serializer = JobSubmitSerializer(data=document)
    data = None
    if serializer.is_valid():
        data = dict(serializer.validated_data)
        slug = data.pop("team", None)
    else:
        errors.update(flatten_errors(serializer.errors))
        slug = document.get("team") if isinstance(document.get("team"), str) else None
        errors.update(_errors_behind(document, serializer.errors, errors))
    team = None
    if "team" not in errors:
        try:
            team = submit_team(request, slug)
        except SubmitTeamError as error:
            errors["team"] = str(error)
        else:
            from strata.accounts import roles

            if not roles.has_role(request, team, roles.MEMBER):  # a viewer reads the team's jobs only
                errors["team"] = (f"you are a {roles.role_in(request, team)} in team {team.slug}: submitting "
                                  "needs the member role")
    return Submission(document=document, errors=errors, data=data if not errors else None, team=team)


def _errors_behind(document: dict[str, Any], first_errors, known: dict[str, str]) -> dict[str, str]:
    """The errors the serializer's first failure hid: it runs again on the document less the failing fields."""
    found: dict[str, str] = {}
    failing = {str(name).split(".")[0] for name in first_errors}
    remaining = dict(document)
    for _ in range(len(SUBMIT_FIELDS)):
        # The spec is checked last (and without a kind, not at all): once it failed, nothing is hidden.
        if failing & {"kind", "spec"} or not failing & set(remaining):
            break
        remaining = {key: value for key, value in remaining.items() if key not in failing}
        again = JobSubmitSerializer(data=remaining)
        if again.is_valid():
            break
        flat = flatten_errors(again.errors)
        for name, message in flat.items():
            if name not in known:
                found.setdefault(name, message)
        failing = {name.split(".")[0] for name in flat}
    return found


def idempotency_key(nonce: str | None, submission: Submission) -> str | None:
    """The key a page submits with: the page's nonce plus the document's digest, so a double click (or a
    retried POST) of one page makes one job, while a changed document or a new page makes a new one."""
    if not nonce or not NONCE.match(nonce):
        return None
    return f"web-{nonce}-{_digest(submission.normalized() or submission.document)[:16]}"


def _digest(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


# --- the CLI and curl equivalents --------------------------------------------------------------------------

def format_duration(seconds: int | float) -> str:
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def format_bytes(count: int) -> str | int:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if count >= size and count % size == 0:
            return f"{count // size}{unit}"
    return count


def _plain_number(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _compact(value: Any) -> Any:
    """Drop nulls and empty objects: the normalized spec fills them in again."""
    if isinstance(value, dict):
        return {key: _compact(item) for key, item in value.items() if item is not None and item != {}}
    return value


def submit_document(submission: Submission) -> dict[str, Any]:
    """The ``strata submit`` file equivalent to a submission: its normalized form when valid (defaults made
    explicit, units readable), else the document as given."""
    normalized = submission.normalized()
    if normalized is None:
        return submission.document
    document: dict[str, Any] = {"name": normalized["name"], "kind": normalized["kind"], "team": normalized["team"]}
    for key, default in ENVELOPE_DEFAULTS.items():
        if normalized[key] != default:
            document[key] = normalized[key]
    document["time_limit"] = format_duration(normalized["time_limit"])
    resources = normalized["resources"]
    document["resources"] = {"gpus": _plain_number(resources["gpus"])}
    if resources.get("gpu_memory"):
        document["resources"]["gpu_memory"] = format_bytes(resources["gpu_memory"])
    if resources.get("cpus"):
        document["resources"]["cpus"] = _plain_number(resources["cpus"])
    if resources.get("memory"):
        document["resources"]["memory"] = format_bytes(resources["memory"])
    if resources.get("workers", 1) != 1:
        document["resources"]["workers"] = resources["workers"]
    if resources.get("node_labels"):
        document["resources"]["node_labels"] = resources["node_labels"]
    spec = _compact(normalized["spec"])
    if spec:
        document["spec"] = spec
    return document


def to_yaml(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)


def cli_snippet(document: dict[str, Any]) -> str:
    return "# job.yaml: submit with `strata submit job.yaml --wait`\n" + to_yaml(document)


def curl_snippet(document: dict[str, Any], base_url: str, key: str | None = None) -> str:
    body = json.dumps(document, indent=2, default=str)
    key = key or "web-" + _digest(document)[:24]
    return (
        f"curl -sS -X POST '{base_url.rstrip('/')}/api/v1/jobs/' \\\n"
        '  -H "Authorization: Bearer $STRATA_TOKEN" \\\n'
        '  -H "Content-Type: application/json" \\\n'
        f'  -H "Idempotency-Key: {key}" \\\n'
        "  --data-binary @- <<'JSON'\n"
        f"{body}\nJSON\n"
    )
