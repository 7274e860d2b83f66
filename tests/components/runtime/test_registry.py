import pytest

from components.runtime import registry
from components.runtime.spec import KindSpec
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

from components.runtime.collections import Collection  # noqa: E402
from components.runtime.plugins import Command, Plugin, ReportError, ReportSchema  # noqa: E402
from components.runtime.spec import SpecError  # noqa: E402


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
    assert "is not a components.runtime.plugins.Plugin" in problems[f"{__name__}:NOT_A_PLUGIN"]
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
from components.runtime.distributed import Strategy  # noqa: E402


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
