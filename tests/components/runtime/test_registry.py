import pytest

from components.runtime.contract import registry
from components.runtime.contract.spec import KindSpec
from components.train.component import TrainComponent
from components.train.spec import TrainSpec


def test_train_kind_is_registered():
    spec = registry.get_kind("train")
    assert isinstance(spec, TrainSpec)
    assert isinstance(spec, KindSpec)
    assert spec.kind == "train"
    assert "train" in registry.kinds()


def test_registry_is_loaded_once():
    assert registry.kinds() is registry.kinds()
    assert registry.get_kind("train") is registry.get_kind("train")


def test_unknown_kind_lists_the_known_kinds():
    with pytest.raises(registry.UnknownKind) as caught:
        registry.get_kind("bake-bread")
    assert caught.value.kind == "bake-bread"
    assert caught.value.known == sorted(registry.kinds())
    assert "train" in caught.value.known
    assert "unknown job kind 'bake-bread'" in str(caught.value)
    assert "train" in str(caught.value)
    assert isinstance(caught.value, LookupError)


def test_load_component_instantiates_the_kinds_component():
    component = registry.load_component("train")
    assert isinstance(component, TrainComponent)
    assert component.kind == "train"


def test_import_path_needs_module_and_attribute():
    assert registry.import_path("components.train.spec:TrainSpec") is TrainSpec
    with pytest.raises(ImportError):
        registry.import_path("components.train.spec")


# -- the plugin manifest ------------------------------------------------------------------------------------

from typing import ClassVar  # noqa: E402

from components.runtime.contract.collections import Collection, Progress  # noqa: E402
from components.runtime.contract.plugins import Command, Plugin, ReportError, ReportSchema  # noqa: E402
from components.runtime.contract.spec import SpecError  # noqa: E402


class HelloSpec(TrainSpec):
    kind: ClassVar[str] = "hello"


class HelloReport(ReportSchema):
    def node(self, payload):
        if not isinstance(payload, dict) or not isinstance(payload.get("greetings"), int):
            raise ReportError({"greetings": "must be a whole number"})
        return {"greetings": payload["greetings"]}


class HelloCommand(Command):
    name: ClassVar[str] = "hello"
    help: ClassVar[str] = "say hello"
    needs_server: ClassVar[bool] = False

    def run(self, args, client):
        print("hello")
        return 0


class ShadowCommand(HelloCommand):
    name: ClassVar[str] = "submit"


HELLO = Plugin(name="hello", kinds=(f"{__name__}:HelloSpec",), reports=f"{__name__}:HelloReport",
               commands=(f"{__name__}:HelloCommand",), benchmarks={"hello": "hello.bench:main"},
               node_services=("hello.service:HelloService",))
CLASH_KIND = Plugin(name="clash", kinds=("components.train.spec:TrainSpec",))
SHADOW = Plugin(name="shadow", commands=(f"{__name__}:ShadowCommand",))
BAD_NAMES = Plugin(name="Bad Name", kinds="components.train.spec:TrainSpec", benchmarks={"UP": "x"})
NOT_A_PLUGIN = {"name": "dict"}


def test_builtins_are_plugins_and_gpushare_is_not_a_kind():
    found = registry.plugins()
    assert {"train", "serving", "gpushare"} <= set(found)
    assert found["gpushare"].kinds == {}
    assert registry.kind_plugin("serve") == "serving" and registry.kind_plugin("train") == "train"
    assert registry.benchmarks()["gpushare"] == "benchmarks.gpushare.bench:main"
    assert "infer" in registry.commands()
    assert registry.problems() == {}


def test_an_outside_plugin_contributes_every_seam(install_plugins):
    install_plugins(f"{__name__}:HELLO")
    assert isinstance(registry.get_kind("hello"), HelloSpec)
    assert registry.kind_plugin("hello") == "hello"
    assert registry.commands()["hello"] is HelloCommand
    assert registry.benchmarks()["hello"] == "hello.bench:main"  # heavy parts are not imported by the registry
    assert ("hello", "hello.service:HelloService") in registry.node_services()
    schema = registry.report_schema("hello")
    assert schema.node({"greetings": 3}) == {"greetings": 3}
    with pytest.raises(ReportError) as caught:
        schema.node({"greetings": "many"})
    assert caught.value.errors == {"greetings": "must be a whole number"}
    with pytest.raises(ReportError):
        schema.attempt({})  # a schema takes only what it declares


def test_a_broken_plugin_costs_its_own_parts(install_plugins):
    install_plugins(f"{__name__}:CLASH_KIND", f"{__name__}:SHADOW", f"{__name__}:BAD_NAMES",
                    f"{__name__}:NOT_A_PLUGIN", "no.such.module:PLUGIN", f"{__name__}:HELLO")
    problems = registry.problems()
    assert "kind 'train' (already train's)" in problems["clash"]
    assert "command 'submit' (already core's)" in problems["shadow"]
    assert "name 'Bad Name' must match" in problems["Bad Name"]
    assert "kinds must be a tuple" in problems["Bad Name"] and "benchmark name 'UP'" in problems["Bad Name"]
    assert "is not a components.runtime.contract.plugins.Plugin" in problems[f"{__name__}:NOT_A_PLUGIN"]
    assert "cannot import the manifest: ModuleNotFoundError" in problems["no.such.module:PLUGIN"]
    # The platform and the healthy plugins are untouched.
    assert set(registry.plugins()) == {"train", "serving", "gpushare", "tuning", "datacache", "straggler", "decentral", "embeddings",
                                       "hello"}
    assert isinstance(registry.get_kind("train"), TrainSpec)
    assert registry.commands()["hello"] is HelloCommand and "submit" not in registry.commands()


def test_outside_packages_register_through_entry_points(install_plugins, monkeypatch):
    from importlib.metadata import EntryPoint

    points = {"strata.plugins": [EntryPoint("hello", f"{__name__}:HELLO", "strata.plugins")],
              "strata.components": [EntryPoint("hello2", f"{__name__}:Hello2Spec", "strata.components")]}
    monkeypatch.setattr(registry, "entry_points", lambda group: points.get(group, []))
    install_plugins()
    assert registry.kind_plugin("hello") == "hello"
    assert registry.kind_plugin("hello2") == "hello2"  # the older one-kind group still works


class Hello2Spec(TrainSpec):
    kind: ClassVar[str] = "hello2"


def test_the_cli_offers_plugin_commands_and_benchmarks(install_plugins, capsys):
    from strata.cli.bench import benchmarks
    from strata.cli.main import main

    install_plugins(f"{__name__}:HELLO")
    assert main(["hello"]) == 0
    assert capsys.readouterr().out == "hello\n"
    assert {"control-plane", "dashboard", "gpushare", "serving", "hello"} <= set(benchmarks())
    assert main(["plugins"]) == 0
    listing = capsys.readouterr().out
    assert "hello" in listing and "commands: hello" in listing and "gpushare" in listing


class Notes(Collection):
    title = "Notes"

    def validate(self, body):
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            raise SpecError({"text": "required: a string"})
        return {"name": body.get("name"), "text": body["text"]}


NOTES = Plugin(name="notes", collections={"notes": f"{__name__}:Notes"})
NOTES_AS_JOBS = Plugin(name="notes-as-jobs", collections={"jobs": f"{__name__}:Notes"})
SECOND_DATASETS = Plugin(name="second-datasets", collections={"datasets": f"{__name__}:Notes"})
NOT_A_COLLECTION = Plugin(name="not-a-collection", collections={"things": f"{__name__}:HelloSpec"})


def test_collections_are_registered_and_their_names_are_unique(install_plugins):
    install_plugins(f"{__name__}:NOTES", f"{__name__}:NOTES_AS_JOBS", f"{__name__}:SECOND_DATASETS",
                    f"{__name__}:NOT_A_COLLECTION")
    collections = registry.collections()
    assert isinstance(collections["notes"], Notes) and collections["notes"].name == "notes"
    assert type(collections["datasets"]).__module__ == "components.datacache.datasets"
    problems = registry.problems()
    assert "collection 'jobs' (already core's)" in problems["notes-as-jobs"]
    assert "collection 'datasets' (already datacache's)" in problems["second-datasets"]
    assert "is not a Collection subclass" in problems["not-a-collection"]


class TypedNotes(Notes):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "text": {"type": "string"}}}


class ListNotes(Notes):
    schema = {"type": "array"}  # a record body is an object


def answer_route(data):
    return {"job": data.job["id"]}


def broken_route(data):
    return {}


answer_route.schema = {"type": "object", "properties": {"job": {"type": "string"}}}
broken_route.schema = {"type": "object", "properties": {"when": {"default": float("nan")}}}  # not JSON

TYPED = Plugin(name="typed", collections={"typed-notes": f"{__name__}:TypedNotes"},
               job_routes={"answer": f"{__name__}:answer_route"})
LIST_NOTES = Plugin(name="list-notes", collections={"list-notes": f"{__name__}:ListNotes"})
BROKEN_ROUTE = Plugin(name="broken-route", job_routes={"broken": f"{__name__}:broken_route"})


def test_a_declared_schema_must_be_a_json_object_schema(install_plugins):
    install_plugins(f"{__name__}:TYPED", f"{__name__}:LIST_NOTES", f"{__name__}:BROKEN_ROUTE")
    assert registry.collections()["typed-notes"].schema == TypedNotes.schema
    assert registry.job_routes()["answer"].schema == answer_route.schema
    assert "list-notes" not in registry.collections() and "broken" not in registry.job_routes()
    problems = registry.problems()
    assert "ListNotes.schema: the schema must describe a JSON object" in problems["list-notes"]
    assert "broken_route.schema: the schema is not JSON" in problems["broken-route"]


# -- distributed-training strategies --------------------------------------------------------------------------------
from components.runtime.contract.distributed import Strategy  # noqa: E402


class Gossip(Strategy):
    name: ClassVar[str] = "gossip"
    runtime: ClassVar[str] = "gossip.runtime:GossipRuntime"  # a node-side path: never imported by the registry


class BadlyNamed(Gossip):
    name: ClassVar[str] = "Gossip Strategy"


class Unnamed(Gossip):
    name: ClassVar[str] = ""


class NoRuntime(Gossip):
    name: ClassVar[str] = "no-runtime"
    runtime: ClassVar[str] = "gossip.runtime"


class SecondDDP(Gossip):
    name: ClassVar[str] = "ddp"


GOSSIP = Plugin(name="gossip", strategies=(f"{__name__}:Gossip",))
GOSSIP_TWICE = Plugin(name="gossip-twice", strategies=(f"{__name__}:Gossip",))
SAME_NAME_TWICE = Plugin(name="same-name-twice", strategies=(f"{__name__}:Gossip", f"{__name__}:Gossip"))
BADLY_NAMED = Plugin(name="badly-named", strategies=(f"{__name__}:BadlyNamed",))
UNNAMED = Plugin(name="unnamed", strategies=(f"{__name__}:Unnamed",))
NO_RUNTIME = Plugin(name="no-runtime", strategies=(f"{__name__}:NoRuntime",))
SECOND_DDP = Plugin(name="second-ddp", strategies=(f"{__name__}:SecondDDP",))
NOT_A_STRATEGY = Plugin(name="not-a-strategy", strategies=(f"{__name__}:Notes",))
STRATEGY_STRING = Plugin(name="strategy-string", strategies=f"{__name__}:Gossip")


def test_the_built_in_strategies_are_registered():
    found = registry.strategies()
    assert {"ddp", "post-local-sgd"} <= set(found)
    assert all(isinstance(strategy, Strategy) for strategy in found.values())
    assert registry.plugins()["train"].strategies.keys() == {"ddp", "post-local-sgd"}
    assert ("strategies", "components.train.strategies:DDP") in registry.plugins()["train"].plugin.paths()


def test_strategies_are_checked_and_their_names_are_unique(install_plugins):
    install_plugins(f"{__name__}:GOSSIP", f"{__name__}:GOSSIP_TWICE", f"{__name__}:SAME_NAME_TWICE",
                    f"{__name__}:BADLY_NAMED", f"{__name__}:UNNAMED", f"{__name__}:NO_RUNTIME",
                    f"{__name__}:SECOND_DDP", f"{__name__}:NOT_A_STRATEGY", f"{__name__}:STRATEGY_STRING")
    found = registry.strategies()
    assert isinstance(found["gossip"], Gossip) and {"ddp", "post-local-sgd"} <= set(found)
    assert type(found["ddp"]).__module__ == "components.train.strategies"  # the first owner keeps its name
    problems = registry.problems()
    assert "strategy 'gossip' (already gossip's)" in problems["gossip-twice"]
    assert "strategy 'ddp' (already train's)" in problems["second-ddp"]
    assert "strategy 'gossip' is named twice" in problems["same-name-twice"]
    assert "a strategy needs a name matching" in problems["badly-named"]
    assert "a strategy needs a name matching" in problems["unnamed"]
    assert "runtime must be the 'module:Class' of a StrategyRuntime" in problems["no-runtime"]
    assert "is not a Strategy subclass" in problems["not-a-strategy"]
    assert "strategies must be a tuple" in problems["strategy-string"]
    # Left out whole: none of their parts is registered.
    assert set(registry.plugins()) & set(problems) == set()
    assert not {"Gossip Strategy", "", "no-runtime"} & set(found)


# -- requirements between plugins ---------------------------------------------------------------------------

from components.runtime.contract.plugins import Requirement  # noqa: E402

NEEDS_MISSING = Plugin(name="needs-missing", requires=("no-such-plugin",))
NEEDS_TRAIN = Plugin(name="needs-train", version="1.2", requires=("train>=0.1,<1",))
NEEDS_NEWER_TRAIN = Plugin(name="needs-newer-train", requires=("train>=99",))
NEEDS_LATER = Plugin(name="needs-later", requires=("later",))  # registered before the plugin it requires
LATER = Plugin(name="later", version="2.0", collections={"later-notes": f"{__name__}:Notes"})
NEEDS_BROKEN = Plugin(name="needs-broken", requires=("shadow",))  # SHADOW is left out (it shadows a core verb)
CYCLE_A = Plugin(name="cycle-a", requires=("cycle-b",))
CYCLE_B = Plugin(name="cycle-b", requires=("cycle-a",))
ON_CYCLE = Plugin(name="on-cycle", requires=("cycle-a",))
ON_ON_CYCLE = Plugin(name="on-on-cycle", requires=("on-cycle",))  # registered before the plugin it requires
BAD_REQUIRES = Plugin(name="bad-requires", version="one", requires="train")
SELF_REQUIRING = Plugin(name="self-requiring", requires=("self-requiring", "train>>1"))


def test_the_built_in_plugins_declare_what_they_import():
    found = registry.plugins()
    assert found["serving"].plugin.requires == ("gpushare", "train")
    assert found["gpushare"].plugin.requires == ("train",)
    assert all(found[name].plugin.requires == ("train",) for name in ("straggler", "decentral", "embeddings"))
    assert found["train"].plugin.requires == () and found["train"].plugin.version == "0.1.0"
    # Listed in the order they are registered in, whatever order their requirements loaded them in.
    assert list(found)[:3] == ["train", "embeddings", "serving"]


def test_a_missing_requirement_leaves_the_dependant_out(install_plugins):
    install_plugins(f"{__name__}:NEEDS_MISSING", f"{__name__}:SHADOW", f"{__name__}:NEEDS_BROKEN",
                    f"{__name__}:NEEDS_NEWER_TRAIN", f"{__name__}:HELLO")
    problems = registry.problems()
    assert problems["needs-missing"] == "ValueError: it requires plugin 'no-such-plugin', which is not installed"
    assert problems["needs-broken"] == "ValueError: it requires plugin 'shadow', which is left out"
    assert problems["needs-newer-train"] == "ValueError: it requires train>=99, but train is version 0.1.0"
    assert not {"needs-missing", "needs-broken", "needs-newer-train"} & set(registry.plugins())
    assert "hello" in registry.plugins() and registry.problems().keys() == {
        "needs-missing", "shadow", "needs-broken", "needs-newer-train"}


def test_a_present_requirement_is_loaded_first(install_plugins):
    install_plugins(f"{__name__}:NEEDS_LATER", f"{__name__}:LATER", f"{__name__}:NEEDS_TRAIN")
    assert registry.problems() == {}
    found = list(registry.plugins())
    assert found[-3:] == ["needs-later", "later", "needs-train"]  # registration order
    assert "later-notes" in registry.collections()


def test_a_cycle_of_requirements_is_reported(install_plugins):
    install_plugins(f"{__name__}:ON_ON_CYCLE", f"{__name__}:CYCLE_A", f"{__name__}:CYCLE_B", f"{__name__}:ON_CYCLE",
                    f"{__name__}:HELLO")
    problems = registry.problems()
    assert problems["cycle-a"] == "ValueError: its requirements form a cycle: cycle-a -> cycle-b -> cycle-a"
    assert problems["cycle-b"] == "ValueError: its requirements form a cycle: cycle-b -> cycle-a -> cycle-b"
    assert problems["on-cycle"] == "ValueError: it requires plugin 'cycle-a', which is left out"
    assert problems["on-on-cycle"] == "ValueError: it requires plugin 'on-cycle', which is left out"
    assert "hello" in registry.plugins()
    assert not {"cycle-a", "cycle-b", "on-cycle", "on-on-cycle"} & set(registry.plugins())


def test_requires_and_version_are_checked_in_the_manifest(install_plugins):
    install_plugins(f"{__name__}:BAD_REQUIRES", f"{__name__}:SELF_REQUIRING")
    problems = registry.problems()
    assert "version 'one' must be dotted whole numbers" in problems["bad-requires"]
    assert "requires must be a tuple of plugin names" in problems["bad-requires"]
    assert "a plugin cannot require itself" in problems["self-requiring"]
    assert "requirement 'train>>1' must be a plugin name" in problems["self-requiring"]


def test_a_requirement_bounds_the_version():
    requirement = Requirement.parse("train >= 0.1, <1")
    assert (requirement.name, requirement.bounds) == ("train", ((">=", "0.1"), ("<", "1")))
    assert str(requirement) == "train>=0.1,<1"
    assert requirement.accepts("0.1.0") and requirement.accepts("0.9") and not requirement.accepts("1.0")
    assert not requirement.accepts("0.0.9") and Requirement.parse("train").accepts("7")
    with pytest.raises(ValueError):
        Requirement.parse("Train")


def test_strata_plugins_shows_versions_and_requirements(capsys):
    from strata.cli.main import main

    assert main(["plugins"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["serving"].split()[1] == "0.1.0" and "requires: gpushare, train;" in lines["serving"]
    assert "requires" not in lines["train"]


def test_the_import_contract_allows_exactly_the_declared_requirements():
    import tomllib
    from pathlib import Path

    config = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    contract = next(contract for contract in config["tool"]["importlinter"]["contracts"]
                    if contract["type"] == "independence")
    builtins = {loaded.name: loaded for loaded in registry.plugins().values()
                if loaded.source in registry.BUILTIN_PLUGINS}
    assert set(contract["modules"]) == {f"components.{name}" for name in builtins}
    allowed = set()
    for line in contract["ignore_imports"]:
        importer, _, imported = line.partition(" -> ")
        allowed.add((importer.split(".")[1], imported.split(".")[1]))
    declared = {(name, requirement.name) for name, loaded in builtins.items()
                for requirement in loaded.plugin.requirements()}
    assert allowed == declared


class OldPanelsSpec(TrainSpec):
    kind: ClassVar[str] = "old-panels"
    panels: ClassVar[tuple[str, ...]] = ("components.train.panels:TrainSummaryPanel",)


OLD_PANELS = Plugin(name="old-panels", kinds=(f"{__name__}:OldPanelsSpec",))


def test_a_kind_that_still_lists_panels_is_left_out_with_where_they_go_now(install_plugins):
    install_plugins(f"{__name__}:OLD_PANELS")
    assert "old-panels" not in registry.plugins()
    assert "name them in the manifest's panels" in registry.problems()["old-panels"]


class OldProgressSpec(TrainSpec):
    kind: ClassVar[str] = "old-progress"
    progress_route: ClassVar[str] = "trials"


def table_route(data):
    return {"rows": []}


def kindless_route(data):
    return {}


table_route.progress = Progress(kinds=("train",), rows=lambda answer: ("rows", []))
kindless_route.progress = Progress(kinds=(), rows=lambda answer: ("", []))

OLD_PROGRESS = Plugin(name="old-progress", kinds=(f"{__name__}:OldProgressSpec",))
TABLE_ROUTES = Plugin(name="table-routes", job_routes={"table": f"{__name__}:table_route"})
KINDLESS_ROUTE = Plugin(name="kindless-route", job_routes={"kindless": f"{__name__}:kindless_route"})


def test_a_live_table_belongs_to_a_job_route_naming_its_kinds(install_plugins):
    install_plugins(f"{__name__}:OLD_PROGRESS", f"{__name__}:TABLE_ROUTES", f"{__name__}:KINDLESS_ROUTE")
    assert "old-progress" not in registry.plugins()
    assert "give the job route a Progress" in registry.problems()["old-progress"]
    assert "kindless" not in registry.job_routes()
    assert "progress.kinds must name at least one kind" in registry.problems()["kindless-route"]
    assert registry.progress_route("train") == ("table", table_route.progress)
    assert registry.progress_route("serve") is None
