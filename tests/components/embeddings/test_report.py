"""The ``embeddings`` plugin's attempt report schema (light: the control plane imports it)."""

from __future__ import annotations

import copy
import json

import pytest

from components.embeddings.report import MAX_FIELDS, CompressionReport
from components.runtime.contract.plugins import ReportError
from components.runtime.testing.conformance.kinds import light_import_problem

FIELD = {"name": "C1", "features": 100, "seen": 90, "distinct": 80, "clusters": 10, "head": 9,
         "bytes_before": 12800, "bytes_after": 640, "seconds": 0.5, "lossless": False, "distortion": 0.25,
         "delta_auc": -0.0012}
PAYLOAD = {"phase": "done", "source": "0b7a4c1e-1111-2222-3333-444455556666", "artifact": "model.pt",
           "workload": "dlrm-ctr", "dataset": "criteo-sample", "ratio_target": 20, "ratio": 19.5,
           "bytes_before": 25600, "bytes_after": 1313, "clustering_s": 1.25,
           "auc_before": 0.78, "auc_after": 0.775, "auc_finetuned": 0.779,
           "logloss_before": 0.45, "logloss_after": 0.46, "logloss_finetuned": 0.455,
           "fields": [FIELD, {**FIELD, "name": "C2", "clusters": None, "bytes_after": 673, "lossless": True,
                              "distortion": 0, "delta_auc": None}]}


def refused(payload) -> dict[str, str]:
    with pytest.raises(ReportError) as caught:
        CompressionReport().attempt(payload)
    return caught.value.errors


def test_a_good_payload_round_trips_normalized():
    original = copy.deepcopy(PAYLOAD)
    cleaned = CompressionReport().attempt(PAYLOAD)
    assert PAYLOAD == original  # the input is not modified
    assert cleaned["phase"] == "done" and cleaned["workload"] == "dlrm-ctr"
    assert cleaned["ratio_target"] == 20.0 and isinstance(cleaned["ratio_target"], float)
    assert cleaned["bytes_before"] == 25600 and isinstance(cleaned["bytes_before"], int)
    assert cleaned["fields"][0] == {**FIELD, "seconds": 0.5, "distortion": 0.25}
    assert cleaned["fields"][1]["clusters"] is None and cleaned["fields"][1]["delta_auc"] is None
    assert isinstance(cleaned["fields"][1]["distortion"], float)
    assert CompressionReport().attempt(cleaned) == cleaned  # idempotent
    json.dumps(cleaned, allow_nan=False)


def test_an_early_report_needs_only_the_phase():
    cleaned = CompressionReport().attempt({"phase": "loading", "ratio_target": 8.0})
    assert cleaned["phase"] == "loading" and cleaned["ratio_target"] == 8.0
    assert cleaned["fields"] == [] and cleaned["ratio"] is None and cleaned["auc_after"] is None
    assert set(cleaned) == set(CompressionReport().attempt(PAYLOAD))
    field = {key: value for key, value in FIELD.items() if key != "delta_auc"}
    assert CompressionReport().attempt({"phase": "clustering", "fields": [field]})["fields"][0]["delta_auc"] is None


def test_strings_are_cut():
    cleaned = CompressionReport().attempt({**PAYLOAD, "dataset": "d" * 1000,
                                           "fields": [{**FIELD, "name": "n" * 1000}]})
    assert len(cleaned["dataset"]) == 256 and len(cleaned["fields"][0]["name"]) == 256


def test_every_bad_field_is_named_at_once():
    fields = [dict(FIELD) for _ in range(5)]
    fields[1]["bytes_before"] = -1
    fields[2]["seconds"] = float("nan")
    fields[3]["clusters"] = 2.5
    fields[3]["colour"] = "red"
    fields[4]["lossless"] = 1
    del fields[4]["seen"]
    errors = refused({**PAYLOAD, "phase": "compressing", "ratio": float("inf"), "auc_after": float("nan"),
                      "bytes_after": -5, "bytes_before": 10.5, "auc_before": 1.5, "workload": "resnet",
                      "fields": fields + ["not an object"], "extra": 1})
    assert set(errors) == {"phase", "ratio", "auc_after", "bytes_after", "bytes_before", "auc_before", "workload",
                           "extra", "fields[1].bytes_before", "fields[2].seconds", "fields[3].clusters",
                           "fields[3].colour", "fields[4].lossless", "fields[4].seen", "fields[5]"}
    assert "finite" in errors["ratio"] and "finite" in errors["fields[2].seconds"]
    assert "at least 0" in errors["bytes_after"] and "integer" in errors["bytes_before"]


def test_the_phase_is_required_and_must_be_known():
    assert set(refused({"ratio": 2.0})) == {"phase"}
    assert set(refused({"phase": None})) == {"phase"}
    assert set(refused({"phase": "Done"})) == {"phase"}
    for phase in ("loading", "clustering", "evaluating", "finetuning", "done"):
        assert CompressionReport().attempt({"phase": phase})["phase"] == phase


def test_too_many_fields_are_refused():
    errors = refused({**PAYLOAD, "fields": [FIELD] * (MAX_FIELDS + 1)})
    assert set(errors) == {"fields"} and str(MAX_FIELDS) in errors["fields"]
    assert len(CompressionReport().attempt({**PAYLOAD, "fields": [FIELD] * MAX_FIELDS})["fields"]) == MAX_FIELDS
    assert set(refused({**PAYLOAD, "fields": {"C1": FIELD}})) == {"fields"}


def test_types_and_nulls_in_a_field():
    errors = refused({"phase": "done", "fields": [{**FIELD, "name": None, "features": True, "lossless": None,
                                                   "clusters": 0, "delta_auc": "0.1"}]})
    assert set(errors) == {"fields[0].name", "fields[0].features", "fields[0].lossless", "fields[0].clusters",
                           "fields[0].delta_auc"}


def test_not_an_object_and_no_node_reports():
    assert refused([PAYLOAD]) == {"": "must be an object"}
    with pytest.raises(ReportError):
        CompressionReport().node({"phase": "done"})


def test_the_report_module_is_light():
    assert light_import_problem("components.embeddings.report") is None
