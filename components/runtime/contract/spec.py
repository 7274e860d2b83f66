"""Light job-kind specifications. Importable by the control plane: no torch, no hivemind here."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

# "package.module:function" -- dotted identifiers, one colon, one identifier after it (a spec naming user code).
ENTRYPOINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class SpecError(ValueError):
    """A spec failed validation. ``errors`` maps a dotted field path to a human message."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{field}: {message}" for field, message in self.errors.items()))


@dataclass(frozen=True)
class SourceRef:
    """A job this spec reads from: ``job`` (an id) at ``field``, which must be a ``kind`` job of the same team
    that SUCCEEDED and stored ``artifact``. ``kind`` None accepts a job of any kind whose ``KindSpec.products``
    names ``artifact`` (a model file several kinds write in one self-describing format). The control plane checks
    it at submit; the node downloads the artifact through ``Context.source_artifact``."""

    field: str
    job: str
    kind: str | None
    artifact: str


class KindSpec(abc.ABC):
    """Describes one job kind for the control plane.

    Lifecycle: the registry instantiates each ``KindSpec`` once, lazily, on first use. The control plane calls
    :meth:`validate` for every submitted job (API, web form, CLI) and stores the normalized dict it returns.
    On a node, the runtime imports :attr:`component` (a ``"module:Class"`` path) only when an attempt of this
    kind starts, so heavy imports stay on the nodes.

    Participants: a kind that sets :attr:`accepts_participants` lets machines outside the cluster join its
    RUNNING jobs (``POST /api/v1/participants/`` with one of the job's access tokens); each join is answered with
    :meth:`participant_payload` of the job (what the participant needs to start).
    """

    kind: ClassVar[str]
    component: ClassVar[str]
    description: ClassVar[str] = ""
    # Whether the kind's running attempts check their callers against the job's access tokens (as an RPC
    # endpoint may): only then can tokens be issued for a job of this kind (POST /api/v1/jobs/{id}/tokens/),
    # and its attempts read their digests through Context.identity.token_digests().
    accepts_tokens: ClassVar[bool] = False
    # Whether the ranks of a multi-worker attempt are independent peers rather than a gang: a rank that fails
    # costs only itself (its siblings go on, and the node reports the attempt failed only when every one of its
    # ranks failed), where a gang's failed rank stops the others at once. A swarm's peers come and go.
    elastic_ranks: ClassVar[bool] = False
    # Whether the kind's jobs may be shrunk rather than preempted when a higher-priority job needs room, and how
    # far, when a job does not say itself (``resources.elastic``): ``{"min_share": GPUs per worker}`` and/or
    # ``{"min_workers": n}``. A shrunk job stops at a checkpoint and restarts at once at the smaller size, so the
    # kind must resume from its checkpoint at any size down to this. None: only jobs that declare it.
    elastic: ClassVar[dict[str, float] | None] = None
    # Whether machines outside the cluster may join a RUNNING job of this kind as participants (volunteers):
    # ``POST /api/v1/participants/`` with one of the job's access tokens (so the kind should accept tokens too).
    # A participant heartbeats to stay in, counts its GPUs against the team's quota and may be handed signed
    # credentials for the job (``components.runtime.shared.credentials``); what it needs to start comes from
    # :meth:`participant_payload`.
    accepts_participants: ClassVar[bool] = False
    # Artifacts a SUCCEEDED job of this kind may have stored in a format other kinds read (e.g. a self-describing
    # "model.pt"): a kind that reads sources with ``SourceRef(kind=None, artifact=...)`` accepts any kind listing it.
    products: ClassVar[tuple[str, ...]] = ()

    def participant_payload(self, spec: dict[str, Any], data: Any) -> dict[str, Any]:
        """What a participant joining a running job of this kind needs to start (JSON), e.g. the addresses of the
        job's peers read from its attempts' reports: the control plane calls it at every join with the job's
        normalized ``spec`` and ``data``, the job's :class:`~components.runtime.contract.panels.PanelData` (``data.job``,
        ``data.reports(plugin, job_id=...)``, ``data.participants()``). Only for kinds that set
        :attr:`accepts_participants`; nothing (``{}``) by default. An exception refuses the join (a 500)."""
        return {}

    @abc.abstractmethod
    def validate(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Return the normalized spec (defaults filled in) or raise :class:`SpecError` naming each bad field."""

    @abc.abstractmethod
    def json_schema(self) -> dict[str, Any]:
        """A JSON Schema of the spec, used for docs and generated forms."""

    def elastic_for(self, spec: dict[str, Any]) -> dict[str, float] | None:
        """The elastic default of a job of this kind with the normalized ``spec`` (:attr:`elastic` unless the kind
        decides per spec): filled into ``resources.elastic`` at submit when the job states none and the kind
        could run at that floor (:meth:`resource_problems` of the smaller request)."""
        return self.elastic

    def resource_problems(self, spec: dict[str, Any], resources: dict[str, Any]) -> dict[str, str]:
        """What is wrong with the normalized ``resources`` (gpus, gpu_memory, workers, node_labels) for this
        normalized ``spec``, as ``{"resources.<field>" or "spec.<field>": message}`` (nothing by default). Checked
        at submit after both are valid, so a job that could never start is a 400."""
        return {}

    def sources(self, spec: dict[str, Any]) -> list[SourceRef]:
        """Other jobs a normalized ``spec`` reads artifacts from (none by default)."""
        return []

    def objective(self, spec: dict[str, Any]) -> tuple[str, str] | None:
        """The metric a job of this kind optimizes, as ``(metric name, "min" | "max")``, given its normalized
        ``spec``: what its jobs (and their child jobs) report under that name. Retention's ``keep: {checkpoints:
        {best: N}}`` ranks checkpoints by it when the policy names no metric. None (the default): no objective."""
        return None

    def entrypoint_spec(self, entrypoint: str) -> dict[str, Any] | None:
        """A normalized spec of this kind that runs the function ``entrypoint`` (``"package.module:function"``,
        called with the attempt's context), or None when this kind cannot run a bare function (the default).
        Tools that need some job doing given work, such as the control-plane benchmark, use it."""
        return None

    def source_problem(self, ref: SourceRef, source_spec: dict[str, Any], spec: dict[str, Any] | None = None
                       ) -> str | None:
        """Why the source job (of the right kind, SUCCEEDED, with the artifact) still cannot be read from, given
        its spec and this job's normalized ``spec``; None when it can. Checked at submit."""
        return None


class Checker:
    """Collects field errors while a spec is validated, so a user sees every bad field at once."""

    def __init__(self, spec: Any, prefix: str = "spec"):
        self.errors: dict[str, str] = {}
        self.prefix = prefix
        if not isinstance(spec, dict):
            raise SpecError({prefix: "must be an object"})
        self.spec = spec

    def _path(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def unknown(self, allowed: set[str]) -> None:
        for name in self.spec:
            if name not in allowed:
                self.errors[self._path(name)] = f"unknown field; allowed: {', '.join(sorted(allowed))}"

    def number(self, name: str, default: Any, *, kind: type = float, minimum=None, maximum=None) -> Any:
        value = self.spec.get(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            self.errors[self._path(name)] = f"must be a{'n integer' if kind is int else ' number'}"
            return default
        if kind is int and int(value) != value:
            self.errors[self._path(name)] = "must be an integer"
            return default
        if minimum is not None and value < minimum:
            self.errors[self._path(name)] = f"must be >= {minimum}"
        if maximum is not None and value > maximum:
            self.errors[self._path(name)] = f"must be <= {maximum}"
        return kind(value)

    def string(self, name: str, default: Any, *, choices=None, max_length: int = 512) -> Any:
        value = self.spec.get(name, default)
        if value is None:
            return None
        if not isinstance(value, str):
            self.errors[self._path(name)] = "must be a string"
            return default
        if len(value) > max_length:
            self.errors[self._path(name)] = f"must be at most {max_length} characters"
        if choices is not None and value not in choices:
            self.errors[self._path(name)] = f"must be one of: {', '.join(choices)}"
        return value

    def not_null(self, *names: str) -> None:
        """Report each of ``names`` that is present and null: for fields whose null is no value (``number``
        and ``string`` return None for an explicit null, which only a nullable field may take)."""
        for name in names:
            if name in self.spec and self.spec[name] is None:
                self.errors[self._path(name)] = "must not be null"

    def boolean(self, name: str, default: bool) -> bool:
        value = self.spec.get(name, default)
        if not isinstance(value, bool):
            self.errors[self._path(name)] = "must be true or false"
            return default
        return value

    def raise_if_errors(self) -> None:
        if self.errors:
            raise SpecError(self.errors)


def check_kind(spec: KindSpec, path: str, name: str | None) -> None:
    """The registry's check of a ``kinds`` part (the seam table's ``check``): a kind name and a heavy component."""
    if not isinstance(getattr(spec, "kind", None), str) or not spec.kind:
        raise TypeError(f"{path} declares no kind")
    if getattr(spec, "panels", None):
        raise TypeError(f"{path}.panels: a kind no longer lists panels; name them in the manifest's panels, with the "
                        "kinds each is shown on in its Panel.kinds")
    if getattr(spec, "progress_route", None) or hasattr(spec, "progress_rows"):
        raise TypeError(f"{path}.progress_route: a kind no longer names its live table; give the job route a "
                        "Progress (components.runtime.contract.collections.Progress) naming the kind")
    if ":" not in (getattr(spec, "component", "") or ""):
        raise TypeError(f"{path}.component must be 'module:Class', got {getattr(spec, 'component', None)!r}")
