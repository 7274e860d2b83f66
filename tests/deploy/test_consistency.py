"""What compose, Kubernetes and systemd must agree on with each other and with the code: setting names,
ports, the graceful-leave time."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# Names the deployment files set that the Python code does not read as STRATA_* settings: the image's health
# check (deploy/healthcheck.py), and what only goes into a node's command line (`strata node --server` in
# Kubernetes, `--address` in the systemd unit).
DEPLOY_ONLY = {"STRATA_HEALTHCHECK_URL", "STRATA_HEALTHCHECK_TIMEOUT", "STRATA_SERVER_URL", "STRATA_NODE_ADDRESS"}


def code_text() -> str:
    return "\n".join(path.read_text() for folder in ("platform", "components")
                     for path in (ROOT / folder).rglob("*.py"))


def deploy_setting_names(manifests: list[dict]) -> set[str]:
    """STRATA_* names the deployments put into a process's environment (not compose's own ${...} variables)."""
    names = set()
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for service in compose["services"].values():
        names |= set(service.get("environment") or {})
    for doc in manifests:
        if doc["kind"] == "ConfigMap":
            names |= set(doc["data"])
        if doc["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            spec = doc["spec"]["template"]["spec"]
            for container in spec.get("initContainers", []) + spec["containers"]:
                names |= {item["name"] for item in container.get("env", [])}
        if doc["kind"] == "Secret":
            names |= set(doc.get("data") or {})
    for unit in (DEPLOY / "systemd").glob("*.service"):
        text = unit.read_text()
        names |= {item.split("=")[0] for line in re.findall(r"^Environment=(.*)$", text, re.MULTILINE)
                  for item in line.split()}
        names |= set(re.findall(r"^#\s+(STRATA_[A-Z0-9_]+)=", text, re.MULTILINE))  # what node.env holds
    return {name for name in names if name.startswith("STRATA_")}


def test_every_strata_setting_the_deployments_set_is_read_by_the_code(full_manifests):
    code = code_text()
    names = deploy_setting_names(full_manifests)
    assert {"STRATA_SECRET_KEY", "STRATA_DATABASE_URL", "STRATA_BROKER_URL", "STRATA_ALLOWED_HOSTS",
            "STRATA_NODE_TOKEN", "STRATA_SCHEDULER_METRICS_PORT", "STRATA_METRICS_BIND", "STRATA_URL"} <= names
    unknown = {name for name in names - DEPLOY_ONLY if f'"{name}"' not in code}
    assert not unknown, f"set in deploy/ but read nowhere in platform/ or components/: {sorted(unknown)}"
    healthcheck = (DEPLOY / "healthcheck.py").read_text()
    assert all(name in healthcheck for name in ("STRATA_HEALTHCHECK_URL", "STRATA_HEALTHCHECK_TIMEOUT"))


def test_graceful_leave_time_is_the_same_everywhere(kubectl, base_manifests):
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    compose_grace = int(compose["services"]["node"]["stop_grace_period"].rstrip("s"))
    unit = configparser.ConfigParser(interpolation=None)
    unit.read_string((DEPLOY / "systemd" / "strata-node.service").read_text())
    systemd_grace = int(unit["Service"]["TimeoutStopSec"])
    daemonset = next(d for d in base_manifests if d["kind"] == "DaemonSet")
    kubernetes_grace = daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert compose_grace == systemd_grace == kubernetes_grace


@pytest.mark.parametrize("port", [8000, 9108, 9109])
def test_ports_are_the_same_everywhere(port, base_manifests):
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    compose = (DEPLOY / "compose.yaml").read_text()
    assert re.search(rf"^EXPOSE .*\b{port}\b", dockerfile, re.MULTILINE)
    assert str(port) in compose
    container_ports = {p["containerPort"] for d in base_manifests if d["kind"] in ("Deployment", "DaemonSet")
                       for c in d["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    assert port in container_ports
