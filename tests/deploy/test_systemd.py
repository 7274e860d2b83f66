"""deploy/systemd: the units parsed with configparser (everywhere) and, where systemd-analyze exists, verified
by systemd itself."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
ROLES = {"strata-server.service": "server", "strata-scheduler.service": "scheduler", "strata-node.service": "node",
         "strata-notifier.service": "notifier"}
INSTALLED_STRATA = "/opt/strata/.venv/bin/strata"


def parse(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=True, interpolation=None, delimiters=("=",))
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string(path.read_text())
    return unit


@pytest.fixture(params=sorted(ROLES))
def unit_file(request) -> Path:
    return UNITS / request.param


def test_the_three_units_exist():
    assert {p.name for p in UNITS.glob("*.service")} == set(ROLES)


def test_unit_runs_its_strata_role_and_restarts(unit_file):
    unit = parse(unit_file)
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == INSTALLED_STRATA and argv[1] == ROLES[unit_file.name]
    assert service["Restart"] in {"always", "on-failure"}
    assert float(service["RestartSec"]) > 0
    assert service["User"] not in ("root", "0") and service["User"] == "strata"
    assert service["EnvironmentFile"].startswith("/etc/strata/")
    assert int(service["LimitNOFILE"]) >= 65536
    assert "STRATA_HOME=/var/lib/strata" in service["Environment"].split()
    assert "strata" in service["StateDirectory"].split()
    assert "network-online.target" in unit["Unit"]["Wants"] and "network-online.target" in unit["Unit"]["After"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_unit_command_line_parses_with_the_strata_cli(unit_file, cli_accepts):
    argv = shlex.split(parse(unit_file)["Service"]["ExecStart"])
    cli_accepts([arg.replace("${STRATA_URL}", "https://strata.example.com")
                    .replace("${STRATA_NODE_ADDRESS}", "10.0.0.21") for arg in argv[1:]])


def test_node_unit_drains_gracefully():
    service = parse(UNITS / "strata-node.service")["Service"]
    # SIGTERM to the agent alone, which stops its worker and node services in order; SIGKILL to the rest only
    # after TimeoutStopSec. control-group would signal every child at once.
    assert service["KillMode"] == "mixed"
    assert int(service["TimeoutStopSec"]) >= 60
    argv = shlex.split(service["ExecStart"])
    assert argv[argv.index("--address") + 1] == "${STRATA_NODE_ADDRESS}"
    assert "STRATA_NODE_ADDRESS=127.0.0.1" in service["Environment"].split()  # a default when node.env has none
    assert argv[argv.index("--metrics-port") + 1] == "9108"
    assert service["EnvironmentFile"] == "/etc/strata/node.env"


def test_scheduler_unit_stops_celery_warmly():
    service = parse(UNITS / "strata-scheduler.service")["Service"]
    assert service["KillMode"] == "mixed" and int(service["TimeoutStopSec"]) >= 30


def test_systemd_analyze_verify(tmp_path):
    """systemd's own check of the units, with ExecStart pointed at this checkout's strata (verify refuses a
    missing binary). Warnings (an unknown key, a bad value) count as failures: verify itself exits 0 on them."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: the units were only parsed (the tests above)")
    strata = ROOT / ".venv" / "bin" / "strata"
    if not strata.exists():
        strata = Path(shutil.which("strata") or "")
    assert strata.is_file(), "no strata executable to point ExecStart at"
    for name in ROLES:
        (tmp_path / name).write_text((UNITS / name).read_text().replace(INSTALLED_STRATA, str(strata)))
    result = subprocess.run([analyze, "verify", "--man=no", *sorted(str(p) for p in tmp_path.iterdir())],
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0 and "Failed to " in result.stderr and "bus" in result.stderr.lower():
        pytest.skip(f"systemd-analyze cannot run in this container: {result.stderr.strip()[:200]}")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr
