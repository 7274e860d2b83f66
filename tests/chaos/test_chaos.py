"""The chaos suite (``make chaos``; ``.ci/run`` runs its bounded form): real jobs of every kind on a multi-host
cluster over PostgreSQL and Redis while node workers are SIGKILLed, a node is SIGSTOPped past its lease, the broker
restarts and is wiped, PostgreSQL's connections are killed, a sharing service, a serving replica and a hivemind
peer are killed, and jobs are cancelled as they complete. The history the control plane and the client wrote is
then checked (benchmarks.core.history_check): it fails on any violation, and prints the figures.

Not part of ``make test`` (tests/conftest.py leaves this folder out unless STRATA_CHAOS names a scale):
``STRATA_CHAOS=bounded`` (CI, about 6 minutes) or ``STRATA_CHAOS=full`` (``make chaos``, three node hosts and
three rounds). STRATA_CHAOS_OUTPUT writes the report as JSON.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from chaos_driver import FAULTS, SCALES, ChaosRun

from benchmarks.core.hosts import PG_SOCKET_DIR, NamespaceError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]


def test_nothing_is_lost_or_doubled_under_faults(tmp_path_factory):
    import psycopg

    scale = SCALES[os.environ.get("STRATA_CHAOS", "bounded")]
    run = ChaosRun(tmp_path_factory.mktemp("chaos"), scale)
    try:
        report = run.execute()
    except NamespaceError as error:
        pytest.fail(f"the chaos suite needs network namespaces and cannot make them here: {error}")
    except psycopg.OperationalError as error:
        pytest.fail(f"the chaos suite runs on the machine's PostgreSQL (Unix socket {PG_SOCKET_DIR}): {error}")
    finally:
        run.close()
    print(report.summary())
    if output := os.environ.get("STRATA_CHAOS_OUTPUT"):
        Path(output).write_text(json.dumps({"scale": scale.name, **report.as_dict()}, indent=2))
    assert not run.errors, "\n".join(run.errors)
    assert report.ok, report.summary()
    injected = report.figures["faults injected"]
    assert set(injected) == set(FAULTS), f"faults not injected: {sorted(set(FAULTS) - set(injected))}"
    assert report.figures["replica answers"] > 0 and report.figures["stale calls rejected"] >= 0
