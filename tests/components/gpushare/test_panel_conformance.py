"""gpushare's panels against the panel conformance suite (on data with nothing shared, and on a job share)."""

from components.runtime.testing.conformance.panels import PanelConformance, StaticData


class TestGpuShareTimelinePanel(PanelConformance):
    panel_path = "components.gpushare.panels:GpuShareTimelinePanel"
    must_render = False  # no device runs a sharing service in this data: the panel hides


class TestGpuShareJobPanel(PanelConformance):
    panel_path = "components.gpushare.panels:GpuShareJobPanel"

    def data(self):
        return StaticData(job={"id": "j1", "kind": "train", "share": {
            "gpus": 0.25, "gpu_memory": 2**30, "device": "n1/0", "policy": "pack"}})
