"""deploy/kubernetes: every rendered manifest validates against the Kubernetes schemas (kubernetes-validate,
offline), and the manifests say what the platform needs (probes, replicas, GPUs, secrets, images)."""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest

K8S_VERSION = "1.30.0"  # one of the versions kubernetes-validate ships schemas for
SCHEMAS = Path(__file__).parent / "schemas"
# Custom resources are not in the Kubernetes schemas: each has a vendored subset of its CRD's schema here.
CRD_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS / "servicemonitor-v1.json"}
UID = 10001  # deploy/Dockerfile's USER

BASE_KINDS = {"Namespace", "ConfigMap", "Secret", "Service", "PersistentVolumeClaim", "Deployment", "DaemonSet",
              "Job", "PodDisruptionBudget"}
FULL_KINDS = BASE_KINDS | {"StatefulSet", "Ingress", "ServiceMonitor"}
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}


# --- helpers ----------------------------------------------------------------------------------------------
def one(docs, kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def generated(docs, kind, prefix):
    """A ConfigMap or Secret from a kustomize generator: its name is PREFIX-<hash>."""
    found = [d for d in docs if d["kind"] == kind and re.fullmatch(rf"{prefix}-[a-z0-9]{{10}}", d["metadata"]["name"])]
    assert len(found) == 1, f"expected one generated {kind} {prefix}-<hash>, found {len(found)}"
    return found[0]


def secret_data(secret) -> dict[str, str]:
    values = {key: base64.b64decode(value).decode() for key, value in (secret.get("data") or {}).items()}
    values.update(secret.get("stringData") or {})
    return values


def pod_spec(workload):
    return workload["spec"]["template"]["spec"]


def containers(workload, init=True):
    spec = pod_spec(workload)
    return list(spec.get("initContainers", []) if init else []) + list(spec["containers"])


def container(workload, name):
    found = [c for c in containers(workload) if c["name"] == name]
    assert len(found) == 1, f"{workload['metadata']['name']} has no container {name}"
    return found[0]


def env(container_):
    return {item["name"]: item for item in container_.get("env", [])}


def workloads(docs):
    return [d for d in docs if d["kind"] in WORKLOADS]


def strata_workloads(docs):
    return [d for d in workloads(docs) if d["metadata"]["name"] not in ("strata-postgres", "strata-redis")]


def matches(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


@pytest.fixture(params=["base", "full"])
def manifests(request):
    return request.getfixturevalue(f"{request.param}_manifests")


# --- schema validation ------------------------------------------------------------------------------------
def validate(doc):
    crd_schema = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if crd_schema is not None:
        jsonschema.validate(doc, json.loads(crd_schema.read_text()))
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_rendered_manifest_validates_against_its_schema(manifests):
    for doc in manifests:
        try:
            validate(doc)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as error:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']} is invalid for Kubernetes {K8S_VERSION}: "
                        f"{getattr(error, 'message', error)}")


def test_renders_exactly_the_expected_kinds(base_manifests, full_manifests):
    # A kind outside these sets would have no schema check above to speak of (SchemaNotFoundError): add it here
    # knowingly, with a vendored schema for a custom resource.
    assert {d["kind"] for d in base_manifests} == BASE_KINDS
    assert {d["kind"] for d in full_manifests} == FULL_KINDS


def test_the_validators_refuse_broken_manifests(full_manifests):
    """The negative control: the same validation refuses a wrong type, an unknown field and a wrong CRD field."""
    web = copy.deepcopy(one(full_manifests, "Deployment", "strata-web"))
    web["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(web)
    web = copy.deepcopy(one(full_manifests, "Deployment", "strata-web"))
    web["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(web)
    monitor = copy.deepcopy(one(full_manifests, "ServiceMonitor", "strata"))
    monitor["spec"]["endpoints"][0]["interval"] = "thirty seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)


def test_everything_lands_in_one_namespace(manifests):
    namespace = one(manifests, "Namespace", "strata")
    for doc in manifests:
        if doc is not namespace:
            assert doc["metadata"].get("namespace") == "strata", f"{doc['kind']} {doc['metadata']['name']}"


# --- the control plane ------------------------------------------------------------------------------------
def test_web_runs_replicated_with_health_and_readiness_probes(manifests):
    web = one(manifests, "Deployment", "strata-web")
    assert web["spec"]["replicas"] >= 2
    assert web["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    server = container(web, "web")
    assert server["image"].split("/")[-1].startswith("strata:")
    assert server["args"][:1] == ["server"] and "0.0.0.0" in server["args"]
    assert server["args"][server["args"].index("--port") + 1] == "8000"
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in server["ports"]
    probes = {name: server[name]["httpGet"] for name in ("readinessProbe", "livenessProbe", "startupProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert probes["startupProbe"]["path"] == "/healthz"
    config = generated(manifests, "ConfigMap", "strata-config")["data"]
    allowed_hosts = config["STRATA_ALLOWED_HOSTS"].split(",")
    for probe in probes.values():
        assert probe["port"] == "http"
        # Django answers only hosts in STRATA_ALLOWED_HOSTS, and a probe's default Host is the pod IP.
        host = {h["name"]: h["value"] for h in probe["httpHeaders"]}["Host"]
        assert host in allowed_hosts


def test_web_service_and_disruption_budget_reach_the_web_pods(manifests):
    web = one(manifests, "Deployment", "strata-web")
    labels = web["spec"]["template"]["metadata"]["labels"]
    service = one(manifests, "Service", "strata-web")
    assert matches(service["spec"]["selector"], labels)
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    budget = one(manifests, "PodDisruptionBudget", "strata-web")
    assert matches(budget["spec"]["selector"]["matchLabels"], labels)
    assert 1 <= budget["spec"]["minAvailable"] < web["spec"]["replicas"]
    # Every node agent calls the control plane through this Service, by a host name Django accepts.
    config = generated(manifests, "ConfigMap", "strata-config")["data"]
    server_url = urlsplit(config["STRATA_SERVER_URL"])
    assert server_url.hostname.split(".")[0] == "strata-web" and server_url.port == 8000
    assert server_url.hostname in config["STRATA_ALLOWED_HOSTS"].split(",")


def test_web_replicas_share_the_artifact_volume(manifests):
    web = one(manifests, "Deployment", "strata-web")
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
              for v in pod_spec(web)["volumes"] if "persistentVolumeClaim" in v}
    mounts = {m["mountPath"]: m["name"] for m in container(web, "web")["volumeMounts"]}
    claim = one(manifests, "PersistentVolumeClaim", claims[mounts["/var/lib/strata/artifacts"]])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # more than one replica writes it


def test_scheduler_runs_two_replicas_with_metrics(manifests):
    scheduler = one(manifests, "Deployment", "strata-scheduler")
    assert scheduler["spec"]["replicas"] >= 2
    main = container(scheduler, "scheduler")
    assert main["args"][0] == "scheduler"
    assert env(main)["STRATA_SCHEDULER_METRICS_PORT"]["value"] == "9109"
    assert env(main)["STRATA_METRICS_BIND"]["value"] == "0.0.0.0"  # not loopback: Prometheus scrapes the pod IP
    assert {"name": "metrics", "containerPort": 9109, "protocol": "TCP"} in main["ports"]
    service = one(manifests, "Service", "strata-scheduler-metrics")
    assert matches(service["spec"]["selector"], scheduler["spec"]["template"]["metadata"]["labels"])
    assert service["spec"]["ports"][0]["port"] == 9109


def test_migrations_run_once_and_the_control_plane_waits_for_them(manifests):
    job = one(manifests, "Job", "strata-migrate")
    migrate = container(job, "migrate")
    assert migrate["command"] == ["django-admin", "migrate", "--noinput"]
    assert pod_spec(job)["restartPolicy"] == "OnFailure"
    assert "STRATA_DATABASE_URL" in env(migrate)
    for name in ("strata-web", "strata-scheduler"):
        init = pod_spec(one(manifests, "Deployment", name))["initContainers"]
        assert len(init) == 1 and "django-admin migrate --check" in " ".join(init[0]["command"])
        assert env(init[0])["STRATA_DATABASE_URL"] == env(migrate)["STRATA_DATABASE_URL"]


def test_control_plane_commands_parse_with_the_strata_cli(manifests, cli_accepts):
    for name, container_name in (("strata-web", "web"), ("strata-scheduler", "scheduler")):
        cli_accepts(container(one(manifests, "Deployment", name), container_name)["args"])


# --- the GPU nodes ----------------------------------------------------------------------------------------
def test_node_daemonset_runs_on_gpu_nodes_and_requests_gpus(manifests):
    daemonset = one(manifests, "DaemonSet", "strata-node")
    spec = pod_spec(daemonset)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    agent = container(daemonset, "node")
    assert agent["image"].split("/")[-1].startswith("strata-node:")
    gpus = agent["resources"]["limits"]["nvidia.com/gpu"]
    assert isinstance(gpus, int) and gpus >= 1


def test_node_agent_command_line(manifests, cli_accepts):
    daemonset = one(manifests, "DaemonSet", "strata-node")
    agent = container(daemonset, "node")
    args, variables = agent["args"], env(agent)
    option = {args[i]: args[i + 1] for i in range(1, len(args) - 1) if args[i].startswith("--")}
    assert args[0] == "node"
    assert option["--address"] == "$(POD_IP)"
    assert variables["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert option["--name"] == "$(NODE_NAME)"
    assert variables["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert option["--server"] == "$(STRATA_SERVER_URL)"
    assert option["--metrics-port"] == "9108"
    assert {"name": "metrics", "containerPort": 9108, "protocol": "TCP"} in agent["ports"]
    # Kubernetes expands $(VAR) only from variables the container defines; an unknown one stays literal.
    referenced = {name for arg in args for name in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg)}
    assert referenced <= set(variables), f"undefined in env: {referenced - set(variables)}"
    token = variables["STRATA_NODE_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token["name"].startswith("strata-node-") and token["key"] == "STRATA_NODE_TOKEN"
    cli_accepts([re.sub(r"\$\((\w+)\)", "x", arg) for arg in args])


def test_node_agent_leaves_gracefully(manifests):
    daemonset = one(manifests, "DaemonSet", "strata-node")
    # The agent drains on SIGTERM: its worker gets 15 s, then the node services stop.
    assert pod_spec(daemonset)["terminationGracePeriodSeconds"] >= 60
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1
    shm = {m["mountPath"]: m["name"] for m in container(daemonset, "node")["volumeMounts"]}["/dev/shm"]
    volume = {v["name"]: v for v in pod_spec(daemonset)["volumes"]}[shm]
    assert volume["emptyDir"]["medium"] == "Memory"


def test_nodes_never_get_control_plane_secrets(manifests):
    """Nodes reach the control plane only through the node API with their token, never the database."""
    agent = container(one(manifests, "DaemonSet", "strata-node"), "node")
    secrets = {item["valueFrom"]["secretKeyRef"]["name"] for item in agent.get("env", [])
               if "secretKeyRef" in item.get("valueFrom", {})}
    assert all(name.startswith("strata-node-") for name in secrets) and secrets
    assert not agent.get("envFrom")


# --- references, secrets, images --------------------------------------------------------------------------
def test_every_referenced_secret_and_config_key_exists(manifests):
    secrets = {d["metadata"]["name"]: secret_data(d) for d in manifests if d["kind"] == "Secret"}
    configs = {d["metadata"]["name"]: d.get("data", {}) for d in manifests if d["kind"] == "ConfigMap"}
    claims = {d["metadata"]["name"] for d in manifests if d["kind"] == "PersistentVolumeClaim"}
    checked = 0
    for workload in workloads(manifests):
        where = workload["metadata"]["name"]
        for container_ in containers(workload):
            for item in container_.get("env", []):
                source = item.get("valueFrom", {})
                if "secretKeyRef" in source:
                    ref = source["secretKeyRef"]
                    assert ref["key"] in secrets.get(ref["name"], {}), f"{where}: {item['name']} from {ref}"
                    checked += 1
                if "configMapKeyRef" in source:
                    ref = source["configMapKeyRef"]
                    assert ref["key"] in configs.get(ref["name"], {}), f"{where}: {item['name']} from {ref}"
            for item in container_.get("envFrom", []):
                if "configMapRef" in item:
                    assert item["configMapRef"]["name"] in configs, where
                if "secretRef" in item:
                    assert item["secretRef"]["name"] in secrets, where
        for volume in pod_spec(workload).get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, where
    assert checked >= 10


def test_no_secret_values_in_config_maps(manifests):
    secret_values = {value for d in manifests if d["kind"] == "Secret" for value in secret_data(d).values()}
    for config in (d for d in manifests if d["kind"] == "ConfigMap"):
        for key, value in config.get("data", {}).items():
            assert not re.search(r"SECRET|PASSWORD|TOKEN|DATABASE_URL|BROKER_URL|CACHE_URL", key), key
            assert value not in secret_values, key
            assert "@" not in urlsplit(value).netloc, f"{key} carries credentials"


def test_shipped_secrets_are_marked_placeholders(base_manifests):
    secrets = [d for d in base_manifests if d["kind"] == "Secret"]
    assert {generated(base_manifests, "Secret", p)["metadata"]["name"] for p in ("strata-control", "strata-node")} \
        == {d["metadata"]["name"] for d in secrets}
    for secret in secrets:
        for key, value in secret_data(secret).items():
            assert "REPLACE-ME" in value, f"{secret['metadata']['name']}.{key} is not a marked placeholder"


def test_example_overlay_replaces_every_placeholder_consistently(full_manifests):
    control = secret_data(generated(full_manifests, "Secret", "strata-control"))
    node = secret_data(generated(full_manifests, "Secret", "strata-node"))
    assert not [key for key, value in {**control, **node}.items() if "REPLACE-ME" in value]
    assert node["STRATA_NODE_TOKEN"] == "node-token-789"
    database = urlsplit(control["STRATA_DATABASE_URL"])
    assert (database.hostname, database.password) == ("strata-postgres", control["POSTGRES_PASSWORD"])
    for key in ("STRATA_BROKER_URL", "STRATA_CACHE_URL"):
        url = urlsplit(control[key])
        assert (url.hostname, url.password) == ("strata-redis", control["REDIS_PASSWORD"])
    # The in-cluster databases read their passwords from the same Secret.
    postgres = container(one(full_manifests, "StatefulSet", "strata-postgres"), "postgres")
    assert env(postgres)["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "POSTGRES_PASSWORD"
    redis = container(one(full_manifests, "StatefulSet", "strata-redis"), "redis")
    assert "--appendonly" in redis["args"] and "$(REDIS_PASSWORD)" in redis["args"]
    for service, port in (("strata-postgres", 5432), ("strata-redis", 6379)):
        assert one(full_manifests, "Service", service)["spec"]["ports"][0]["port"] == port


def test_images_are_consistent(manifests):
    control = {c["image"] for w in strata_workloads(manifests) if w["kind"] != "DaemonSet" for c in containers(w)}
    nodes = {c["image"] for c in containers(one(manifests, "DaemonSet", "strata-node"))}
    assert len(control) == 1 and len(nodes) == 1, (control, nodes)
    control_image, node_image = control.pop(), nodes.pop()
    control_repo, control_tag = control_image.rsplit(":", 1)
    node_repo, node_tag = node_image.rsplit(":", 1)
    assert control_repo.rsplit("/", 1)[-1] == "strata" and node_repo.rsplit("/", 1)[-1] == "strata-node"
    assert control_repo.rsplit("/", 1)[:-1] == node_repo.rsplit("/", 1)[:-1]  # one registry
    assert node_tag.startswith(control_tag) and control_tag != "latest"  # one release: 0.1.0 and 0.1.0-cu128


def test_strata_pods_run_as_the_images_non_root_user(manifests):
    for workload in strata_workloads(manifests):
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == UID
        assert spec["automountServiceAccountToken"] is False
        for container_ in containers(workload):
            assert container_["securityContext"]["allowPrivilegeEscalation"] is False
            assert container_["securityContext"]["capabilities"]["drop"] == ["ALL"]


# --- services, monitoring, ingress ------------------------------------------------------------------------
def test_every_service_selects_pods(manifests):
    templates = [w["spec"]["template"]["metadata"]["labels"] for w in workloads(manifests)]
    for service in (d for d in manifests if d["kind"] == "Service"):
        assert any(matches(service["spec"]["selector"], labels) for labels in templates), service["metadata"]


def test_service_monitor_scrapes_web_scheduler_and_nodes(full_manifests):
    monitor = one(full_manifests, "ServiceMonitor", "strata")
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = {d["metadata"]["name"]: d for d in full_manifests
                if d["kind"] == "Service" and matches(selector, d["metadata"]["labels"])}
    assert set(selected) == {"strata-web", "strata-scheduler-metrics", "strata-node-metrics"}
    endpoint_ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    scraped = {name: {p["name"] for p in s["spec"]["ports"]} & endpoint_ports for name, s in selected.items()}
    assert scraped == {"strata-web": {"http"}, "strata-scheduler-metrics": {"metrics"},
                       "strata-node-metrics": {"metrics"}}
    ports = {name: s["spec"]["ports"][0]["port"] for name, s in selected.items()}
    assert ports == {"strata-web": 8000, "strata-scheduler-metrics": 9109, "strata-node-metrics": 9108}


def test_ingress_routes_to_the_web_service_with_tls(full_manifests):
    ingress = one(full_manifests, "Ingress", "strata-web")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    service = one(full_manifests, "Service", backend["name"])
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    assert ingress["spec"]["tls"][0]["hosts"] == [ingress["spec"]["rules"][0]["host"]]
    config = generated(full_manifests, "ConfigMap", "strata-config")["data"]
    assert config["STRATA_SECURE_COOKIES"] == "true" and config["STRATA_NUM_PROXIES"] == "1"
    assert config["STRATA_HTTPS"] == "1" and config["STRATA_SECURE_PROXY_SSL_HEADER"] == "X-Forwarded-Proto"
    # Node agents call the Service over plain HTTP inside the cluster: Django must not redirect them.
    assert config["STRATA_SSL_REDIRECT"] == "0"
    assert config["STRATA_SERVER_URL"].startswith("http://strata-web.")
    assert ingress["spec"]["rules"][0]["host"] in config["STRATA_ALLOWED_HOSTS"].split(",")
