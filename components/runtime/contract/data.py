"""The prepared-data seam: where a job's preprocessed training data comes from.

Many jobs read the same preprocessed data: every trial of a sweep decodes and transforms the same dataset with
the same pipeline. A workload therefore names what it prepares by a **recipe** -- a JSON-able description of
the dataset and of the pipeline with its parameters -- and hands the function that computes it to
:func:`prepare`. Two jobs that name equal recipes get the same data; :func:`recipe_key` (a content hash of the
recipe) identifies it.

Where the data comes from:

1. a **data provider** that a plugin names in its manifest (``Plugin.data_providers``: a :class:`DataProvider`
   subclass) and that the job opted into through its spec's ``data`` options, e.g. a node-local cache of
   preprocessed samples shared by every job on the node. The first provider that returns something wins;
2. otherwise this process's memo (:class:`Memo`): one build per recipe per process, so the trials that a node's
   device service hosts side by side prepare their data once. Concurrent callers of one recipe wait for the
   one build.

A job's spec carries the options as ``data: {option: value}`` (a kind that prepares data takes them as
``spec.data``; a kind whose children share data hands its own ``spec.data`` to each child). Each option belongs to the one provider that declares it
(:attr:`DataProvider.options`); :func:`option_errors` names every option no installed provider takes, and
every value its provider refuses, as ``{"spec.data.<option>": message}``, so a bad spec is a 400 at submit.

Prepared data is shared: callers must treat what :func:`prepare` returns as read-only.

Two more things a provider may do:

- **resolve** names at submit (:meth:`DataProvider.resolve`): the control plane hands it a ``lookup`` of the
  submitting team's records in the plugins' collections (:mod:`components.runtime.contract.collections`), so a job may
  name a dataset the team registered and the stored spec carries what the name meant then;
- provide a **stream of epochs** (:meth:`DataProvider.epochs`, read with :func:`open_epochs`): a workload whose
  data is augmented afresh every epoch asks for each epoch's samples, and the provider decides where they
  come from (computed now, or a cached earlier computation reused) -- the :class:`EpochSource` protocol.

One option belongs to the core itself (:data:`CORE_PROVIDERS`): ``mount: {alias: name}`` mounts the team's
uploaded data sets (``strata data upload``, ``/api/v1/data/``) read-only at ``$STRATA_DATA_DIR/<alias>`` for
the job's processes. Checked at submit like any option, and resolved there through ``lookup(DATA_COLLECTION,
name)`` to the data set's digest, so the stored spec says exactly what was mounted (:func:`mounts_of`).

A provider's options may read uploaded data sets too (a registered dataset whose source is one, say):
:meth:`DataProvider.data_sets` names them, resolved like a mount. The core treats them as it treats mounts
(:func:`data_sets_of`): the job is linked to them at submit (kept while it is unfinished), its attempts may
fetch them, and the node fetches each into its data cache before the attempt starts, read-only and visible in
the attempt's sandbox, where the job's processes find it with :func:`data_set_path`.

Light: imported by the control plane (for the option check); no torch or numpy here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

log = logging.getLogger(__name__)

MEMO_ENV = "STRATA_DATA_MEMO_ENTRIES"
DEFAULT_MEMO_ENTRIES = 4
MAX_OPTIONS_BYTES = 16_384


class DataProvider:
    """A plugin's source of prepared data (a plugin names the subclass in ``Plugin.data_providers``).

    Subclasses set :attr:`options` (the keys of a spec's ``data`` that opt a job into this provider) and
    override :meth:`validate` (on the control plane, at submit) and :meth:`fetch` (on the node, in the job's
    process). They are instantiated with no arguments, once per process; importing one must stay light.
    """

    options: ClassVar[frozenset[str]] = frozenset()

    def validate(self, data: dict[str, Any]) -> dict[str, str]:
        """Problems with this provider's options in ``data``, as ``{option: message}`` or, for a field inside an
        option, ``{"option.field": message}`` (none by default)."""
        return {}

    def resolve(self, data: dict[str, Any], lookup: Callable[[str, str], dict[str, Any] | None]) -> dict[str, Any]:
        """This provider's options of a spec being submitted, with names of the team's records replaced by what
        they name (``lookup(collection, name)`` gives a record's body or None). Raise
        :class:`components.runtime.contract.spec.SpecError` ``({option: message})`` for a name that names nothing. Must
        be idempotent: a resolved spec (a child's, a resubmit) resolves to itself. By default: unchanged."""
        return data

    def epochs(self, data: dict[str, Any], job: dict[str, Any]) -> EpochSource | None:
        """The stream of epochs this provider serves for ``data`` (a job's options), or None. ``job`` has the
        job's ``seed``, ``epochs`` (the planned number) and ``device``. Called in the job's process."""
        return None

    def fetch(self, key: str, recipe: dict[str, Any], build: Callable[[], Any], data: dict[str, Any]) -> Any:
        """The prepared data of ``recipe`` (content hash ``key``) or None to leave it to the next source.
        ``build()`` computes it; a cache calls it on a miss. Called only for jobs whose ``data`` names one of
        :attr:`options`."""
        return None

    def data_sets(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        """The team's uploaded data sets this provider's (resolved) options read on the node, each as a mount
        resolves (``{name, digest, format, size, expanded_size[, file]}``: what ``lookup(DATA_COLLECTION, name)``
        answered at submit). The core links the job to them, lets its attempts fetch them and has the node fetch
        each before the attempt starts; the job's processes find one with :func:`data_set_path`. Called on the
        control plane and on the node with a stored spec's options: pure and cheap. None by default."""
        return []


class EpochSource:
    """A stream of training epochs: what a workload whose data is augmented afresh each epoch reads from.

    ``classes`` and ``test()`` describe the data; ``epoch(n)`` gives the samples of epoch ``n`` as ``(inputs,
    labels)`` tensors (the workload shuffles them); after training an epoch the workload calls
    ``after_epoch(n, compute_seconds, evaluation)``, whose True answer ends training early (a target reached);
``lr_scale(n)`` scales the learning rate while epoch ``n`` trains.
    ``metrics(n)`` are numbers worth reporting about epoch ``n``'s data (where it came from, how fast);
    ``state_dict``/``load_state_dict`` carry the source's decisions across a resume, so a resumed run reads
    the same epochs. ``close()`` frees workers and files.
    """

    classes: int = 0

    def test(self) -> tuple[Any, Any]:
        raise NotImplementedError

    def epoch(self, epoch: int) -> tuple[Any, Any]:
        raise NotImplementedError

    def metrics(self, epoch: int) -> dict[str, float]:
        return {}

    def after_epoch(self, epoch: int, compute_seconds: float, evaluation: dict[str, float]) -> bool:
        return False

    def lr_scale(self, epoch: int) -> float:
        """The factor the workload applies to its learning rate while it trains epoch ``epoch`` (1.0 by
        default): a source whose epochs change character partway (fresh data after epochs of reused data, say)
        schedules the rate with them. A workload reading a source sets each optimizer
        group's rate to its base rate times this at the start of every epoch (the built-in ``cnn-dataset`` does;
        a team's own ``Workload`` over :func:`open_epochs` should too)."""
        return 1.0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 -- optional
        pass

    def close(self) -> None:  # noqa: B027 -- optional
        pass


MOUNT_OPTION = "mount"
DATA_COLLECTION = "data"  # what :meth:`Mounts.resolve` asks ``lookup`` for: the team's uploaded data sets
MAX_MOUNTS = 32
MOUNT_ALIAS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DATA_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
RESOLVED_MOUNT = frozenset({"name", "digest", "format", "file", "size", "expanded_size"})
DIGEST = re.compile(r"^[0-9a-f]{64}$")


class Mounts(DataProvider):
    """The core's data option ``mount: {alias: data set name}``: the team's uploaded data sets, read-only at
    ``$STRATA_DATA_DIR/<alias>`` on the node. Resolved at submit to ``{alias: {name, digest, format, size,
    expanded_size[, file]}}``; a resolved mount is kept as long as the team still has that data set unchanged."""

    options: ClassVar[frozenset[str]] = frozenset({MOUNT_OPTION})

    def validate(self, data: dict[str, Any]) -> dict[str, str]:
        mount = data.get(MOUNT_OPTION)
        if not isinstance(mount, dict) or not mount:
            return {MOUNT_OPTION: "must be an object of alias: data set name (strata data list shows the names), "
                                  "e.g. {images: pets-2024}"}
        if len(mount) > MAX_MOUNTS:
            return {MOUNT_OPTION: f"must mount at most {MAX_MOUNTS} data sets"}
        errors = {}
        for alias, value in mount.items():
            where = f"{MOUNT_OPTION}.{str(alias)[:64]}"
            if not isinstance(alias, str) or not MOUNT_ALIAS.match(alias) or alias in (".", ".."):
                errors[where] = "the alias must be 1 to 64 letters, digits, '.', '_' or '-' (a directory name)"
            elif isinstance(value, dict):
                if not (set(value) <= RESOLVED_MOUNT and isinstance(value.get("name"), str)
                        and isinstance(value.get("digest"), str) and DIGEST.match(value["digest"])):
                    errors[where] = "must name a data set (a resolved mount is {name, digest, ...})"
            elif not isinstance(value, str) or not DATA_NAME.match(value):
                errors[where] = "must name one of the team's data sets (lower case letters, digits, '.', '_', '-')"
        return errors

    def resolve(self, data: dict[str, Any], lookup: Callable[[str, str], dict[str, Any] | None]) -> dict[str, Any]:
        from components.runtime.contract.spec import SpecError

        resolved: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for alias, value in (data.get(MOUNT_OPTION) or {}).items():
            name = value.get("name") if isinstance(value, dict) else value
            found = lookup(DATA_COLLECTION, str(name))
            where = f"{MOUNT_OPTION}.{alias}"
            if found is None:
                errors[where] = f"no data set named {name!r} in this team (strata data list shows them)"
            elif isinstance(value, dict) and value.get("digest") != found.get("digest"):
                errors[where] = (f"data set {name!r} is no longer the one this job mounted "
                                 f"({str(value.get('digest'))[:12]}): it was deleted or uploaded again")
            else:
                resolved[alias] = {key: found[key] for key in RESOLVED_MOUNT if key in found}
        if errors:
            raise SpecError(errors)
        return {MOUNT_OPTION: resolved}


CORE_PROVIDERS: tuple[DataProvider, ...] = (Mounts(),)
"""Options of the core itself, taken besides the installed providers' wherever options are checked and
resolved."""


def mounts_of(spec: Any) -> dict[str, dict[str, Any]]:
    """The resolved mounts of a job's (stored) spec: ``{alias: {name, digest, format, size, ...}}``."""
    data = spec.get("data") if isinstance(spec, dict) else None
    mount = data.get(MOUNT_OPTION) if isinstance(data, dict) else None
    if not isinstance(mount, dict):
        return {}
    return {alias: value for alias, value in mount.items()
            if isinstance(value, dict) and isinstance(value.get("digest"), str) and DIGEST.match(value["digest"])}


def _mount_shaped(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("name"), str) and DATA_NAME.match(value["name"]) is not None
            and isinstance(value.get("digest"), str) and DIGEST.match(value["digest"]) is not None)


def data_sets_of(spec: Any, providers: list[DataProvider] | None = None) -> dict[str, dict[str, Any]]:
    """Every uploaded data set a job's (stored, resolved) spec reads, by digest: its mounts
    (:func:`mounts_of`) and those its data options' providers name (:meth:`DataProvider.data_sets`). A provider
    that raises or answers something else than mounts adds nothing."""
    found = {str(mount["digest"]): mount for mount in mounts_of(spec).values()}
    data = spec.get("data") if isinstance(spec, dict) else None
    if not isinstance(data, dict):
        return found
    for provider in _providers() if providers is None else providers:
        mine = {option: data[option] for option in provider.options if option in data}
        if not mine:
            continue
        try:
            named = list(provider.data_sets(mine) or [])
        except Exception as error:  # noqa: BLE001 - a broken provider names nothing, it never crashes
            log.warning("data provider %s: data_sets() failed: %r", type(provider).__name__, error)
            continue
        for mount in named:
            if _mount_shaped(mount):
                found.setdefault(str(mount["digest"]), {key: mount[key] for key in RESOLVED_MOUNT if key in mount})
    return found


DATA_SETS_ENV = "STRATA_DATA_SETS_DIR"
"""Where a node keeps the data sets it fetched (one read-only directory per digest): set by the node agent for
every process it starts (its worker, the attempts' processes, its services)."""


def data_set_path(digest: str) -> Path:
    """The read-only directory of the uploaded data set ``digest`` on this node (an archive unpacked, or a
    directory holding the one file under its name), fetched for the running attempt before it started: the job
    must read it (a mount, or :meth:`DataProvider.data_sets`). LookupError when it is not here."""
    if not isinstance(digest, str) or not DIGEST.match(digest):
        raise LookupError(f"{str(digest)[:80]!r} is no data set digest")
    root = os.environ.get(DATA_SETS_ENV, "").strip()
    if not root:
        raise LookupError(f"data set {digest[:12]} is not on this machine: uploaded data sets are fetched by a "
                          f"node for the attempts that read them ({DATA_SETS_ENV} is not set)")
    path = Path(root) / digest
    if not path.is_dir():
        raise LookupError(f"data set {digest[:12]} is not on this node ({path}): only the data sets a job reads "
                          "are fetched for its attempts")
    return path


def recipe_key(recipe: dict[str, Any]) -> str:
    """The content hash of a recipe: equal recipes (key order aside) have equal keys."""
    encoded = json.dumps(recipe, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(encoded.encode()).hexdigest()


def _providers() -> list[DataProvider]:
    from components.runtime.contract import registry

    return registry.data_providers()


def option_errors(data: Any, providers: list[DataProvider] | None = None, *,
                  prefix: str = "spec.data") -> dict[str, str]:
    """Every problem with a spec's ``data`` options at once: not an object, not JSON, an option no installed
    provider takes, or a value its provider refuses."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        return {prefix: "must be an object of data options"}
    try:
        size = len(json.dumps(data, allow_nan=False))
    except (TypeError, ValueError):
        return {prefix: "must hold finite JSON values only"}
    if size > MAX_OPTIONS_BYTES:
        return {prefix: f"must be at most {MAX_OPTIONS_BYTES} bytes as JSON"}
    providers = [*CORE_PROVIDERS, *(_providers() if providers is None else providers)]
    errors: dict[str, str] = {}
    owned = {option for provider in providers for option in provider.options}
    for option in data:
        if option not in owned:
            known = ", ".join(sorted(owned)) or "none: no installed plugin provides data"
            errors[f"{prefix}.{option}"] = f"no installed plugin takes this data option (known: {known})"
    for provider in providers:
        mine = {option: data[option] for option in provider.options if option in data}
        if not mine:
            continue
        try:
            problems = provider.validate(mine)
        except Exception as error:  # noqa: BLE001 - a broken provider refuses, it never crashes the API
            problems = {option: f"could not be checked: {type(error).__name__}" for option in mine}
        for option, message in problems.items():
            errors[f"{prefix}.{option}" if option else prefix] = str(message)
    return errors


def resolve_options(data: dict[str, Any], lookup: Callable[[str, str], dict[str, Any] | None], *,
                    providers: list[DataProvider] | None = None,
                    prefix: str = "spec.data") -> tuple[dict[str, Any], dict[str, str]]:
    """``(resolved data, errors)``: each opted-into provider's :meth:`DataProvider.resolve` of its options."""
    from components.runtime.contract.spec import SpecError

    resolved = dict(data)
    errors: dict[str, str] = {}
    for provider in [*CORE_PROVIDERS, *(_providers() if providers is None else providers)]:
        mine = {option: data[option] for option in provider.options if option in data}
        if not mine:
            continue
        try:
            answer = provider.resolve(dict(mine), lookup)
        except SpecError as error:
            errors.update({f"{prefix}.{option}" if option else prefix: message
                           for option, message in error.errors.items()})
            continue
        except Exception as error:  # noqa: BLE001 - a broken provider refuses, it never crashes the API
            errors.update({f"{prefix}.{option}": f"could not be resolved: {type(error).__name__}" for option in mine})
            continue
        resolved.update({option: value for option, value in answer.items() if option in provider.options})
    return resolved, errors


def open_epochs(data: dict[str, Any] | None, job: dict[str, Any], *,
                providers: list[DataProvider] | None = None) -> EpochSource:
    """The stream of epochs the first opted-into provider serves for ``data``; LookupError when none does."""
    data = data or {}
    for provider in _providers() if providers is None else providers:
        if not any(option in data for option in provider.options):
            continue
        source = provider.epochs({o: data[o] for o in provider.options if o in data}, dict(job))
        if source is not None:
            return source
    raise LookupError("no installed data provider serves a stream of epochs for these data options: "
                      f"{', '.join(sorted(data)) or 'none given'}")


class Memo:
    """Prepared data per recipe key in this process: at most ``entries`` kept, least recently used dropped.
    Concurrent callers of one key wait for a single build; a build that raises is not kept."""

    def __init__(self, entries: int):
        self.entries = max(int(entries), 0)
        self._values: OrderedDict[str, Any] = OrderedDict()
        self._building: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self.builds = 0
        self.hits = 0

    def get(self, key: str, build: Callable[[], Any]) -> Any:
        if self.entries == 0:
            self.builds += 1
            return build()
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                self.hits += 1
                return self._values[key]
            gate = self._building.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                if key in self._values:  # built by the caller we waited for
                    self._values.move_to_end(key)
                    self.hits += 1
                    return self._values[key]
            try:
                value = build()
            finally:
                with self._lock:
                    self._building.pop(key, None)
            with self._lock:
                self.builds += 1
                self._values[key] = value
                while len(self._values) > self.entries:
                    self._values.popitem(last=False)
            return value

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


def _memo_entries() -> int:
    raw = os.environ.get(MEMO_ENV, "").strip()
    try:
        return int(raw) if raw else DEFAULT_MEMO_ENTRIES
    except ValueError:
        log.warning("%s=%r is not an integer; using %d", MEMO_ENV, raw, DEFAULT_MEMO_ENTRIES)
        return DEFAULT_MEMO_ENTRIES


MEMO = Memo(_memo_entries())


def prepare(recipe: dict[str, Any] | None, build: Callable[[], Any], data: dict[str, Any] | None = None, *,
            providers: list[DataProvider] | None = None, memo: Memo | None = None) -> Any:
    """The prepared data of ``recipe``: from the first opted-into provider that has it, else from this process's
    memo, else ``build()``. A recipe of None (data nobody else could share) is always built."""
    if recipe is None:
        return build()
    key = recipe_key(recipe)
    data = data or {}
    for provider in _providers() if providers is None else providers:
        if not any(option in data for option in provider.options):
            continue
        found = provider.fetch(key, recipe, build, {o: data[o] for o in provider.options if o in data})
        if found is not None:
            return found
    return (MEMO if memo is None else memo).get(key, build)


def check_provider(provider: DataProvider, path: str, name: str | None) -> None:
    """The registry's check of a ``data_providers`` part: its options are a set of option names."""
    options = provider.options
    if not isinstance(options, frozenset | set) or not all(isinstance(o, str) and o for o in options):
        raise TypeError(f"{type(provider).__name__}.options must be a set of option names")
