"""Conformance suite for dashboard panels (:class:`components.runtime.contract.panels.Panel`).

Subclass :class:`PanelConformance` and point it at a panel; override :meth:`PanelConformance.data` to give it a
:class:`~components.runtime.contract.panels.PanelData` that makes it render something (the default is an empty static
twin, on which most panels hide)::

    class TestPrimesPanel(PanelConformance):
        panel_path = "strata_primes.panels:PrimesPanel"

        def data(self):
            return StaticData(job={"spec": {"limit": 100}}, metrics={"primes_found": [(1, 25.0, 0.0)]})

It checks the panel's declared slug, title and placement, that ``applies`` answers a bool, that ``render``
returns None or one of the documented shapes (figure, table, text), JSON with no NaN once the dashboard's
``finite`` scrubbed it, the same on a second call, and that the panel module imports nothing heavy.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from components.runtime.contract.panels import Panel, PanelData, StaticPanelData, finite
from components.runtime.contract.registry import import_path
from components.runtime.testing.conformance.kinds import light_import_problem

SLUG_RE = re.compile(r"^[a-z][a-z0-9-]{0,63}$")
SHAPES = {"figure", "table", "text", "error"}


StaticData = StaticPanelData  # the twin shipped with the contract (components.runtime.contract.panels)




class PanelConformance:
    """The Panel contract, as pytest tests. Set :attr:`panel_path` and override :meth:`data`."""

    panel_path: ClassVar[str] = ""
    must_render: ClassVar[bool] = True  # data() is meant to make it show something

    def panel_class(self) -> type[Panel]:
        panel_class = import_path(self.panel_path)
        assert isinstance(panel_class, type) and issubclass(panel_class, Panel), f"{self.panel_path} is no Panel"
        return panel_class

    def data(self) -> PanelData:
        return StaticData(job={})

    def test_it_declares_slug_title_and_placement(self):
        panel_class = self.panel_class()
        assert SLUG_RE.match(panel_class.slug), panel_class.slug
        assert isinstance(panel_class.title, str) and panel_class.title.strip()
        assert panel_class.placement in ("job", "cluster")

    def test_applies_answers_a_bool(self):
        data = self.data()
        assert isinstance(self.panel_class()().applies(data.job or {}), bool)
        assert isinstance(self.panel_class()().applies({}), bool)  # a job it knows nothing about

    def test_render_gives_a_documented_shape_as_json(self):
        content = self.panel_class()().render(self.data())
        if content is None:
            assert not self.must_render, "render() hid the panel on the data meant to show it"
            return
        assert isinstance(content, dict) and content and set(content) <= SHAPES, content
        if "text" in content:
            assert isinstance(content["text"], str)
        if "table" in content:
            table = content["table"]
            assert isinstance(table.get("columns"), list) and isinstance(table.get("rows"), list)
            widths = {len(row) for row in table["rows"]} | ({len(table["columns"])} if table["columns"] else set())
            assert len(widths) <= 1, "ragged table: rows (and columns, when given) differ in width"
        if "figure" in content:
            assert isinstance(content["figure"].get("data"), list)
        json.dumps(finite(content), allow_nan=False)

    def test_render_is_free_of_side_effects(self):
        data = self.data()
        first = json.dumps(finite(self.panel_class()().render(data)), sort_keys=True, default=str)
        second = json.dumps(finite(self.panel_class()().render(data)), sort_keys=True, default=str)
        assert first == second

    def test_render_copes_with_no_data(self):
        content = self.panel_class()().render(StaticData(job={}))
        assert content is None or (isinstance(content, dict) and set(content) <= SHAPES)

    def test_the_panel_module_is_light(self):
        problem = light_import_problem(self.panel_path.partition(":")[0])
        assert problem is None, problem
