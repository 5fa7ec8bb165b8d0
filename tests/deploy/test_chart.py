"""The Helm chart, proven without a cluster: ``helm lint`` and ``helm template`` for each values
file, every rendered object validated against the Kubernetes API schemas with unknown fields
refused, a policy scan with no finding left unjustified, the plain manifests in deploy/k8s
current, and the chart's own promises (probes, termination budgets, security contexts) read
from what it renders. The tools come from ``make tools`` (scripts/install-chart-tools.sh)."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "ferry"
TOOLS = ROOT / ".tools"
HELM = TOOLS / "bin" / "helm"
VALUES = ["values.yaml", "values-gpu.yaml", "values-external-redis.yaml",
          "values-external-sentinel.yaml"]
KUBERNETES_VERSIONS = ["1.30.0", "1.33.0"]  # the oldest the chart allows (kubeVersion), newest
PEERS = '[{"namespaceSelector": {"matchLabels": {"team": "ml"}}}]'
EXTERNAL = "redis.builtin=false,redis.externalUrl=redis://redis.example:6379/0"
# Renders of the default values with settings changed, beside the values files' own, so that the
# API schemas and the policy scan read them too.
VARIANTS = {
    "grpc-off": ("values.yaml", "--set", "gateway.grpcPort=0"),
    "grpc-headless": ("values.yaml", "--set", "gateway.service.headless=true",
                      "--set-json", f"networkPolicy.ingressFrom={PEERS}"),
    "jobs-s3": ("values.yaml", "--set", "jobs.store.url=s3://shelf/ferry",
                "--set", "jobs.store.s3Secret=shelf-s3", "--set", "jobs.sources=file:///mnt/p/",
                "--set-json", 'jobs.sourceVolumes=[{"name": "photos", "mountPath": "/mnt/p", '
                '"volume": {"persistentVolumeClaim": {"claimName": "photos"}}}]'),
    "rollouts": ("values.yaml", "--set", "rollouts.adminSecret=ferry-admin",
                 "--set-json", 'rollouts.models={"moderation": {"stable": "1", "candidate": "2", '
                 '"share": 5, "shadow": 10, "steps": [5, 50, 100]}}',
                 "--set-json", 'rollouts.cascades={"moderation": {"review_model": "heavy", '
                 '"when": "unsafe"}}'),
    "redis-sentinel": ("values.yaml", "--set", "redis.sentinel.enabled=true",
                       "--set", "autoscaling.keda.enabled=true"),
    "inference-log": ("values.yaml", "--set", "inferenceLog.enabled=true",
                      "--set-json", 'inferenceLog.models={"moderation": 0.1, "sim": 1}',
                      "--set-json", 'inferenceLog.redact=["password", "ssn"]'),
    "inference-log-s3": ("values.yaml", "--set", "inferenceLog.enabled=true",
                         "--set-json", 'inferenceLog.models={"moderation": 0.5}',
                         "--set", "inferenceLog.sink=s3://shelf/log",
                         "--set", "inferenceLog.s3Secret=shelf-s3",
                         "--set", "redis.sentinel.enabled=true"),
}


def run(*command: str | Path) -> subprocess.CompletedProcess[str]:
    if not Path(command[0]).exists():
        pytest.fail(f"{command[0]} is missing: run `make tools`")
    return subprocess.run([str(c) for c in command], capture_output=True, text=True,
                          timeout=300, check=False)


def render(values: str, *extra: str) -> str:
    done = run(HELM, "template", "ferry", CHART, "--namespace", "ferry", "-f",
               CHART / values, *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout


def objects(manifest: str) -> Iterator[dict[str, Any]]:
    for document in yaml.safe_load_all(manifest):
        if document:
            yield document


def by_kind(manifest: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects(manifest)}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("rendered")
    files = {}
    for values in VALUES:
        path = directory / f"{values}.rendered.yaml"
        path.write_text(render(values))
        files[values] = path
    for name, (values, *extra) in VARIANTS.items():
        path = directory / f"{name}.rendered.yaml"
        path.write_text(render(values, *extra))
        files[name] = path
    return files


@pytest.mark.parametrize("values", VALUES)
def test_helm_lint_passes(values: str) -> None:
    done = run(HELM, "lint", CHART, "--strict", "-f", CHART / values)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_fits_the_kubernetes_api(rendered: dict[str, Path], version: str) -> None:
    validate = TOOLS / "venv" / "bin" / "kubernetes-validate"
    done = run(validate, "--strict", "-k", version, *rendered.values())
    assert done.returncode == 0, done.stdout + done.stderr
    crds = {"ScaledObject", "TriggerAuthentication", "ServiceMonitor"}  # no schema bundled
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("WARN"):
            assert any(f"kind {kind} " in line for kind in crds), line


def test_the_policy_scan_finds_nothing_unjustified(rendered: dict[str, Path]) -> None:
    checkov = TOOLS / "venv" / "bin" / "checkov"
    directory = next(iter(rendered.values())).parent
    done = run(checkov, "-d", directory, "--framework", "kubernetes", "--skip-download",
               "--compact", "--quiet")
    assert done.returncode == 0, done.stdout[-6000:]
    passed = int(done.stdout.split("Passed checks: ", 1)[1].split(",", 1)[0])
    assert passed > 300  # it read the manifests (about 900 checks over the three renders)
    for manifest in rendered.values():
        for item in objects(manifest.read_text()):
            for key, why in item["metadata"].get("annotations", {}).items():
                if key.startswith("checkov.io/skip"):
                    check, _, reason = why.partition("=")
                    assert check.startswith("CKV_") and len(reason) > 30, (key, why)


def test_the_plain_manifests_are_the_chart_rendered() -> None:
    expected = render("values.yaml", *shlex.split(_k8s_values()))
    assert (ROOT / "deploy" / "k8s" / "ferry.yaml").read_text() == expected, "run `make k8s`"


def _k8s_values() -> str:
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("K8S_VALUES :="):
            return line.split(":=", 1)[1].strip()
    raise AssertionError("K8S_VALUES is not in the Makefile")


@pytest.mark.parametrize("name", [*VALUES, *VARIANTS])
def test_pods_run_locked_down_with_probes(rendered: dict[str, Path], name: str) -> None:
    for item in objects(rendered[name].read_text()):
        if item["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = item["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, item["metadata"]["name"]
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"]["drop"] == ["ALL"]
            assert "readinessProbe" in container and "livenessProbe" in container
            assert "limits" in container["resources"]


def test_termination_outlasts_long_polls_and_the_batchers_drain() -> None:
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objects(render("values.yaml"))}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    gateway = by_kind[("Deployment", "ferry-gateway")]["spec"]["template"]["spec"]
    batcher = by_kind[("StatefulSet", "ferry-batcher")]["spec"]["template"]["spec"]
    assert gateway["terminationGracePeriodSeconds"] > values["gateway"]["maxPollS"]
    assert batcher["terminationGracePeriodSeconds"] > values["batcher"]["shutdownGraceS"]
    env = {e["name"]: e.get("value") for e in batcher["containers"][0]["env"]}
    assert env["FERRY_OWNED_PARTITIONS"] == "auto" and env["FERRY_STATEFULSET"] == "ferry-batcher"


def test_triton_gets_gpus_and_gpu_nodes() -> None:
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objects(render("values-gpu.yaml"))}
    pod = by_kind[("Deployment", "ferry-triton")]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert "--model-repository=s3://models-bucket/ferry" in pod["containers"][0]["args"]
    scaled = by_kind[("ScaledObject", "ferry-batcher")]["spec"]
    assert len(scaled["triggers"]) == 16 and scaled["maxReplicaCount"] == 16
    gpus = by_kind[("ScaledObject", "ferry-triton")]["spec"]
    assert gpus["scaleTargetRef"]["name"] == "ferry-triton"
    assert {t["metadata"]["stream"] for t in gpus["triggers"]} == {
        f"ferry:{{p{p}}}:tasks" for p in range(16)}
    assert all(t["metadata"]["lagCount"] == "5000" for t in gpus["triggers"])
    assert "replicas" not in by_kind[("Deployment", "ferry-triton")]["spec"]  # KEDA's to set


@pytest.mark.parametrize(("setting", "complaint"), [
    ("batcher.replicas=17", "between 1 and partitions"),
    ("auth.mode=api_key", "auth.existingSecret"),
    ("auth.mode=basic", "value must be one of"),
    ("redis.builtin=false", "redis.externalUrl is required"),
    ("triton.enabled=false", "triton.externalUrl is required"),
    ("batcher.tritonResolveS=0", "/batcher/tritonResolveS"),
    ("batcher.tritonResolveS=-1", "/batcher/tritonResolveS"),
    ("batcher.tritonResolveS=often", "/batcher/tritonResolveS"),
    ("redis.cluster=true", "redis.cluster needs an external Redis Cluster"),
    ("gateway.grpcPort=8000", "gateway.grpcPort must differ from gateway.port"),
    ("gateway.grpcPort=70000", "/gateway/grpcPort"),
    ("gateway.service.grpcPort=80", "gateway.service.grpcPort must differ"),
    ("gateway.grpcPort=0,gateway.service.headless=true", "it needs gateway.grpcPort"),
    ("jobs.store.persistence.accessModes={ReadWriteOnce}", "needs ReadWriteMany"),
    ("jobs.store.url=http://bucket", "/jobs/store/url"),
    ("rollouts.models.m.stable=one", "/rollouts/models/m/stable"),
    ("rollouts.models.m.stable=1,rollouts.models.m.share=150", "/rollouts/models/m/share"),
    ("rollouts.cascades.m.review_model=x,rollouts.cascades.m.when=often",
     "/rollouts/cascades/m/when"),
    ("redis.sentinel.enabled=true,redis.sentinel.sentinels=2", "/redis/sentinel/sentinels"),
    ("redis.sentinel.replicas=0", "/redis/sentinel/replicas"),
    ("redis.sentinel.masterName=my master", "/redis/sentinel/masterName"),
    ("redis.sentinel.downAfterMs=50", "/redis/sentinel/downAfterMs"),
    ("redis.sentinel.externalAddresses={sentinel-0}", "/redis/sentinel/externalAddresses/0"),
    ("redis.minReplicas=-1", "/redis/minReplicas"),
    ("redis.minReplicas=one", "/redis/minReplicas"),
    ("redis.waitMs=0", "/redis/waitMs"),
    ("redis.sentinel.enabled=true,redis.minReplicas=3", "redis.minReplicas (3) exceeds"),
    ("redis.minReplicas=1", "the built-in Redis's replicas (0)"),
    (f"{EXTERNAL},redis.cluster=true,redis.sentinel.enabled=true,"
     "redis.sentinel.externalAddresses={s:26379}", "redis.sentinel and redis.cluster exclude"),
    (f"{EXTERNAL},redis.sentinel.enabled=true", "redis.sentinel.externalAddresses (host:port"),
    ("redis.sentinel.enabled=true,redis.sentinel.externalAddresses={s:26379}",
     "they need redis.builtin=false"),
    ("inferenceLog.enabled=true", "inferenceLog.models names no model"),
    ("inferenceLog.enabled=true,inferenceLog.models.m=1.5", "/inferenceLog/models/m"),
    ("inferenceLog.enabled=true,inferenceLog.models.m=0", "/inferenceLog/models/m"),
    ("inferenceLog.sink=ftp://x/y", "/inferenceLog/sink"),
    ("inferenceLog.enabled=true,inferenceLog.models.m=1,inferenceLog.logger.replicas=2",
     "needs ReadWriteMany"),
])
def test_bad_values_are_refused_with_a_reason(setting: str, complaint: str) -> None:
    done = run(HELM, "template", "ferry", CHART, "--set", setting)
    assert done.returncode != 0 and complaint in done.stderr, done.stderr


def test_an_external_redis_cluster_is_named_to_ferry_and_keda() -> None:
    items = list(objects(render("values-external-redis.yaml")))
    for item in items:
        name = item["metadata"]["name"]
        if item["kind"] in ("Deployment", "StatefulSet") and "triton" not in name:
            env = {e["name"]: e.get("value") for e in
                   item["spec"]["template"]["spec"]["containers"][0]["env"]}
            assert env["FERRY_REDIS_CLUSTER"] == "true", name
            assert env["FERRY_REDIS_URL"].startswith("rediss://")
    scaled = [i for i in items if i["kind"] == "ScaledObject"]
    triggers = [t for s in scaled for t in s["spec"]["triggers"]]
    assert triggers and {t["type"] for t in triggers} == {"redis-cluster-streams"}
    assert all(t["metadata"]["addresses"].count(":6379") == 3 and
               t["metadata"]["enableTLS"] == "true" for t in triggers)


def test_the_tensorrt_engine_is_built_on_the_pods_gpu_for_the_configs_shapes() -> None:
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objects(render("values-gpu.yaml"))}
    pod = by_kind[("Deployment", "ferry-triton")]["spec"]["template"]["spec"]
    copy, build = pod["initContainers"]
    assert copy["image"] == pod["containers"][0]["image"]  # the repository rides in Triton's image
    assert build["image"] == "nvcr.io/nvidia/tensorrt:25.01-py3"
    assert build["resources"]["limits"]["nvidia.com/gpu"] == 1
    config = (ROOT / "deploy" / "triton" / "models" / "moderation_trt" /
              "config.pbtxt").read_text()
    args = build["args"]
    assert "--fp16" in args and "--saveEngine=/engines/moderation_trt/1/model.plan" in args
    for arg in args:  # the shapes trtexec builds for are the ones the config promises Triton
        if arg.startswith(("--minShapes", "--maxShapes")):
            batch = int(arg.split(":", 1)[1].split("x")[0])
            assert batch in (1, 64) and arg.endswith("x3x320x320")
            assert arg in config
    assert "max_batch_size: 64" in config
    assert "--model-repository=/engines" in pod["containers"][0]["args"]
    plain = {(o["kind"], o["metadata"]["name"]): o for o in objects(render("values.yaml"))}
    assert "initContainers" not in plain[("Deployment", "ferry-triton")]["spec"]["template"][
        "spec"]


def _gateway(manifest: str) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The gateway's container, its Service's ports and its NetworkPolicy's ingress rules."""
    items = by_kind(manifest)
    pod = items[("Deployment", "ferry-gateway")]["spec"]["template"]["spec"]
    return (pod["containers"][0], items[("Service", "ferry-gateway")]["spec"]["ports"],
            items[("NetworkPolicy", "ferry-gateway")]["spec"]["ingress"])


@pytest.mark.parametrize("name", ["values.yaml", "grpc-headless"])
def test_the_gateway_serves_grpc_beside_http(rendered: dict[str, Path], name: str) -> None:
    container, ports, rules = _gateway(rendered[name].read_text())
    assert {"name": "grpc", "containerPort": 8001, "protocol": "TCP"} in container["ports"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FERRY_GRPC_PORT"] == "8001"
    # Kubernetes' grpc probe asks grpc.health.v1.Health, which Ferry does not serve.
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    assert {"name": "grpc", "port": 8001, "targetPort": "grpc", "protocol": "TCP",
            "appProtocol": "grpc"} in ports
    http_rules = [r for r in rules if {"port": "http", "protocol": "TCP"} in r["ports"]]
    assert http_rules and all({"port": "grpc", "protocol": "TCP"} in r["ports"]
                              for r in http_rules)


def test_the_headless_service_lists_the_gateway_pods_for_grpc(rendered: dict[str, Path]) -> None:
    items = by_kind(rendered["grpc-headless"].read_text())
    headless = items[("Service", "ferry-gateway-headless")]["spec"]
    gateway = items[("Deployment", "ferry-gateway")]["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["selector"] == gateway["selector"]["matchLabels"]
    assert headless["ports"] == [{"name": "grpc", "port": 8001, "targetPort": "grpc",
                                  "protocol": "TCP", "appProtocol": "grpc"}]
    (rule,) = items[("NetworkPolicy", "ferry-gateway")]["spec"]["ingress"]
    assert rule["from"] == yaml.safe_load(PEERS)  # gRPC from the peers HTTP is allowed from
    assert ("Service", "ferry-gateway-headless") not in by_kind(
        rendered["values.yaml"].read_text())


def test_grpc_port_0_leaves_no_grpc_port_behind(rendered: dict[str, Path]) -> None:
    container, ports, rules = _gateway(rendered["grpc-off"].read_text())
    assert [p["name"] for p in container["ports"]] == ["http"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FERRY_GRPC_PORT"] == "0"
    assert [p["name"] for p in ports] == ["http"]
    assert [p["port"] for rule in rules for p in rule["ports"]] == ["http"]


@pytest.mark.parametrize(("setting", "shown"), [("gateway.grpcPort=8001", True),
                                                 ("gateway.grpcPort=0", False)])
def test_the_notes_say_how_to_reach_the_grpc_port(setting: str, shown: bool) -> None:
    done = run(HELM, "install", "ferry", CHART, "--namespace", "ferry", "--dry-run=client",
               "--set", setting)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    for line in ("kubectl -n ferry port-forward svc/ferry-gateway 8001:8001",
                 "perf_analyzer -i grpc -u 127.0.0.1:8001"):
        assert (line in notes) is shown, notes


def _batcher_env(manifest: str) -> dict[str, Any]:
    batcher = by_kind(manifest)[("StatefulSet", "ferry-batcher")]
    return {e["name"]: e.get("value") for e in
            batcher["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize(("extra", "expected"), [
    ((), "ferry-triton-headless:8000"),
    (("--set", "batcher.inferOverHttp=false"), ""),
    (("--set", "triton.enabled=false", "--set", "triton.externalUrl=t.example:8001",
      "--set", "triton.externalHttpUrl=t.example:8000"), "t.example:8000"),
    (("--set", "triton.enabled=false", "--set", "triton.externalUrl=t.example:8001"), ""),
])
def test_the_batchers_infer_calls_go_to_tritons_http_port_where_the_chart_knows_it(
        extra: tuple[str, ...], expected: str) -> None:
    manifest = render("values.yaml", *extra)
    env = _batcher_env(manifest)
    assert env["FERRY_TRITON_HTTP_URL"] == expected
    assert env["FERRY_TRITON_URL"].endswith(":8001")
    if "triton.enabled=false" not in extra:  # the chart's Triton lets the batcher reach HTTP
        policy = by_kind(manifest)[("NetworkPolicy", "ferry-triton")]
        ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports", [])}
        assert {"grpc", "http"} <= ports


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector (matchLabels, matchExpressions In/NotIn) selects."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] in ("In", "NotIn"), expression
        inside = labels.get(expression["key"]) in expression["values"]
        if inside != (expression["operator"] == "In"):
            return False
    return True


@pytest.mark.parametrize("name", ["values.yaml", "values-gpu.yaml"])
def test_the_batchers_reach_every_ready_triton_pod_through_a_headless_service(
        rendered: dict[str, Path], name: str) -> None:
    items = by_kind(rendered[name].read_text())
    triton = items[("Deployment", "ferry-triton")]["spec"]
    service, headless = (items[("Service", n)] for n in ("ferry-triton", "ferry-triton-headless"))
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is False  # starting, draining: left out
    assert headless["spec"]["selector"] == triton["selector"]["matchLabels"]
    assert headless["spec"]["ports"] == service["spec"]["ports"] == [
        {"name": port, "port": number, "targetPort": port, "protocol": "TCP"}
        for port, number in (("http", 8000), ("grpc", 8001), ("metrics", 8002))]
    assert {p["name"] for p in triton["template"]["spec"]["containers"][0]["ports"]} == {
        "http", "grpc", "metrics"}
    assert "clusterIP" not in service["spec"]  # the gateways' one virtual address stays
    batcher = items[("StatefulSet", "ferry-batcher")]["spec"]["template"]["spec"]
    env = _container_env(batcher)
    assert (env["FERRY_TRITON_URL"], env["FERRY_TRITON_HTTP_URL"]) == (
        "ferry-triton-headless:8001", "ferry-triton-headless:8000")
    assert env["FERRY_TRITON_RESOLVE_S"] == "2"
    gateway = items[("Deployment", "ferry-gateway")]["spec"]["template"]["spec"]
    assert _container_env(gateway)["FERRY_TRITON_URL"] == "ferry-triton:8001"
    assert "FERRY_TRITON_RESOLVE_S" not in _container_env(gateway)
    for pod in (batcher, gateway):  # named once: of two entries, the last would win unseen
        names = [e["name"] for e in pod["containers"][0]["env"]]
        assert names.count("FERRY_TRITON_URL") == 1


def test_prometheus_scrapes_triton_through_one_service_only(rendered: dict[str, Path]) -> None:
    items = by_kind(rendered["values-gpu.yaml"].read_text())
    selector = items[("ServiceMonitor", "ferry")]["spec"]["selector"]
    scraped = {name for (kind, name), item in items.items()
               if kind == "Service" and _matches(selector, item["metadata"]["labels"])}
    assert "ferry-triton" in scraped and "ferry-batcher" in scraped
    assert "ferry-triton-headless" not in scraped  # the same pods: every series twice


EXTERNAL_TRITON = "triton-a.example:8001,triton-b.example:8001"


def test_an_external_triton_is_every_processs_triton(rendered: dict[str, Path]) -> None:
    manifest = render("values.yaml", "--set", "triton.enabled=false",
                      "--set-json", f'triton.externalUrl="{EXTERNAL_TRITON}"',
                      "--set-json", "batcher.tritonResolveS=0.5")
    items = by_kind(manifest)
    assert not [name for kind, name in items if "triton" in name]  # no Triton, no Service
    env, gateway = _batcher_env(manifest), _container_env(gateway_pod(manifest))
    assert env["FERRY_TRITON_URL"] == gateway["FERRY_TRITON_URL"] == EXTERNAL_TRITON
    assert (env["FERRY_TRITON_RESOLVE_S"], env["FERRY_TRITON_HTTP_URL"]) == ("0.5", "")
    file = _batcher_env(rendered["values-external-redis.yaml"].read_text())
    assert file["FERRY_TRITON_URL"] == "triton.inference.svc:8001"


def gateway_pod(manifest: str) -> dict[str, Any]:
    pod: dict[str, Any] = by_kind(manifest)[("Deployment", "ferry-gateway")]["spec"]["template"][
        "spec"]
    return pod


def test_every_gateway_mounts_the_jobs_volume_or_reads_the_bucket(
        rendered: dict[str, Path]) -> None:
    default = rendered["values.yaml"].read_text()
    claim = by_kind(default)[("PersistentVolumeClaim", "ferry-jobs")]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    pod = gateway_pod(default)
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["FERRY_JOBS"] == "true" and env["FERRY_JOB_STORE_DIR"] == "/var/lib/ferry/jobs"
    assert {"name": "jobs", "mountPath": "/var/lib/ferry/jobs"} in pod["containers"][0][
        "volumeMounts"]
    assert {"name": "jobs", "persistentVolumeClaim": {"claimName": "ferry-jobs"}} in pod[
        "volumes"]
    s3 = rendered["jobs-s3"].read_text()
    assert ("PersistentVolumeClaim", "ferry-jobs") not in by_kind(s3)
    pod = gateway_pod(s3)
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["FERRY_JOB_STORE_URL"]["value"] == "s3://shelf/ferry"
    assert "FERRY_JOB_STORE_DIR" not in env
    assert env["FERRY_S3_SECRET_ACCESS_KEY_FILE"]["value"] == \
        "/var/run/secrets/ferry/s3/AWS_SECRET_ACCESS_KEY"  # a file, not the secret in the env
    assert {"name": "s3", "secret": {"secretName": "shelf-s3", "defaultMode": 0o400}} in pod[
        "volumes"]
    assert {"name": "photos", "mountPath": "/mnt/p", "readOnly": True} in container[
        "volumeMounts"]
    assert env["FERRY_JOB_SOURCES"]["value"] == "file:///mnt/p/"


def test_rollouts_reach_every_process_and_the_admin_token_is_a_file(
        rendered: dict[str, Path]) -> None:
    manifest = rendered["rollouts"].read_text()
    pod = gateway_pod(manifest)
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert json.loads(env["FERRY_ROLLOUTS"]) == {"moderation": {
        "stable": "1", "candidate": "2", "share": 5, "shadow": 10, "steps": [5, 50, 100]}}
    assert env["FERRY_ADMIN_TOKEN_FILE"] == "/var/run/secrets/ferry/admin/admin-token"
    assert {"name": "admin", "secret": {"secretName": "ferry-admin", "defaultMode": 0o400}} in \
        pod["volumes"]
    batcher = by_kind(manifest)[("StatefulSet", "ferry-batcher")]["spec"]["template"]["spec"]
    benv = {e["name"]: e.get("value") for e in batcher["containers"][0]["env"]}
    assert json.loads(benv["FERRY_ROLLOUTS"]) == json.loads(env["FERRY_ROLLOUTS"])
    assert json.loads(benv["FERRY_CASCADES"]) == {"moderation": {"review_model": "heavy",
                                                                 "when": "unsafe"}}
    default = gateway_pod(rendered["values.yaml"].read_text())["containers"][0]["env"]
    assert not {"FERRY_ROLLOUTS", "FERRY_ADMIN_TOKEN_FILE"} & {e["name"] for e in default}


SENTINELS = ",".join(f"ferry-redis-sentinel-{i}.ferry-redis-sentinel.ferry.svc:26379"
                     for i in range(3))
EXTERNAL_SENTINELS = ",".join(f"sentinel-{i}.redis.example.internal:26379" for i in range(3))


def _container_env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}


def test_the_built_in_group_is_a_master_its_replicas_and_three_sentinels(
        rendered: dict[str, Path]) -> None:
    items = by_kind(rendered["redis-sentinel"].read_text())
    nodes = items[("StatefulSet", "ferry-redis")]["spec"]
    sentinels = items[("StatefulSet", "ferry-redis-sentinel")]["spec"]
    assert nodes["replicas"] == 3 and sentinels["replicas"] == 3  # a master, 2 replicas; 3
    for spec, service in ((nodes, "ferry-redis-headless"), (sentinels, "ferry-redis-sentinel")):
        assert spec["serviceName"] == service and spec["podManagementPolicy"] == "Parallel"
        headless = items[("Service", service)]["spec"]
        assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
        budget = items[("PodDisruptionBudget", spec["serviceName"].removesuffix("-headless"))]
        assert budget["spec"]["maxUnavailable"] == 1
        assert budget["spec"]["selector"] == spec["selector"]
    assert ("Service", "ferry-redis") not in items  # a Service over all nodes reaches replicas
    image = yaml.safe_load((CHART / "values.yaml").read_text())["redis"]["image"]
    node_pod, sentinel_pod = nodes["template"]["spec"], sentinels["template"]["spec"]
    assert node_pod["containers"][0]["image"] == sentinel_pod["containers"][0]["image"] == \
        f"{image['repository']}:{image['tag']}"
    node_env, sentinel_env = _container_env(node_pod), _container_env(sentinel_pod)
    assert node_env["NODES"].split(",") == [
        f"ferry-redis-{i}.ferry-redis-headless.ferry.svc:6379" for i in range(3)]
    assert node_env["SELF"] == "$(POD_NAME).ferry-redis-headless.ferry.svc:6379"
    assert node_env["SENTINELS"] == sentinel_env["SENTINELS"] == SENTINELS
    assert (sentinel_env["QUORUM"], sentinel_env["DOWN_AFTER_MS"],
            sentinel_env["FAILOVER_TIMEOUT_MS"]) == ("2", "5000", "60000")
    assert sentinel_env["PASSWORD_FILE"] == "/var/run/secrets/ferry/redis/password"
    assert node_pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1] == \
        "node-handover"
    assert node_pod["affinity"]["podAntiAffinity"]  # spread over nodes where it can be


def test_the_group_runs_the_charts_script_and_rolls_when_it_changes(
        rendered: dict[str, Path]) -> None:
    items = by_kind(rendered["redis-sentinel"].read_text())
    source = (CHART / "scripts" / "redis-sentinel.sh").read_text()
    script = items[("ConfigMap", "ferry-redis-scripts")]["data"]["redis-sentinel.sh"]
    assert script == source.rstrip("\n")
    for name in ("ferry-redis", "ferry-redis-sentinel"):
        template = items[("StatefulSet", name)]["spec"]["template"]
        assert template["metadata"]["annotations"]["checksum/scripts"] == \
            hashlib.sha256(source.encode()).hexdigest()
        assert {"name": "scripts", "configMap": {"name": "ferry-redis-scripts"}} in \
            template["spec"]["volumes"]
    # What a sentinel's configuration says (the script writes it; test_redis_sentinel_group.py
    # runs it): names, not addresses, and Redis's password to watch the master with.
    for line in ("sentinel resolve-hostnames yes", "sentinel announce-hostnames yes",
                 "sentinel announce-ip %s", "sentinel auth-pass %s %s",
                 "sentinel down-after-milliseconds %s %s", "sentinel failover-timeout %s %s",
                 "requirepass %s", "--replicaof", "--masterauth", "--replica-announce-ip"):
        assert line in script, line


@pytest.mark.parametrize(("name", "sentinels", "master", "secret", "password_file", "wait_ms"), [
    ("redis-sentinel", SENTINELS, "mymaster", "ferry-redis",
     "/var/run/secrets/ferry/redis/password", "500"),
    ("values-external-sentinel.yaml", EXTERNAL_SENTINELS, "ferry", "ferry-redis-sentinel",
     "/var/run/secrets/ferry/redis-sentinel/password", "250"),
])
def test_ferry_and_keda_find_the_master_through_the_sentinels(
        rendered: dict[str, Path], name: str, sentinels: str, master: str, secret: str,
        password_file: str, wait_ms: str) -> None:
    items = by_kind(rendered[name].read_text())
    for workload in (("Deployment", "ferry-gateway"), ("StatefulSet", "ferry-batcher")):
        pod = items[workload]["spec"]["template"]["spec"]
        env = _container_env(pod)
        assert env["FERRY_REDIS_SENTINELS"] == sentinels
        assert env["FERRY_REDIS_SENTINEL_MASTER"] == master
        assert env["FERRY_REDIS_SENTINEL_PASSWORD_FILE"] == password_file
        assert "FERRY_REDIS_SENTINEL_PASSWORD" not in env  # a file, never the secret itself
        assert (env["FERRY_REDIS_MIN_REPLICAS"], env["FERRY_REDIS_WAIT_MS"]) == ("1", wait_ms)
        directory = password_file.rsplit("/", 1)[0]
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"]
                    if m["mountPath"] == directory]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == secret
    triggers = [t for (kind, _), item in items.items() if kind == "ScaledObject"
                for t in item["spec"]["triggers"]]
    assert triggers and all(t["type"] == "redis-sentinel-streams" and
                            t["metadata"]["addresses"] == sentinels and
                            t["metadata"]["sentinelMaster"] == master for t in triggers)
    auth = items[("TriggerAuthentication", "ferry-redis")]["spec"]["secretTargetRef"]
    assert {"parameter": "sentinelPassword", "name": secret, "key": "password"} in auth


@pytest.mark.parametrize(("extra", "expected"), [
    ((), None),  # one Redis: nothing to wait for (Ferry's own default, 0)
    (("--set", "redis.sentinel.enabled=true", "--set", "redis.minReplicas=2"), "2"),
    (("--set", "redis.sentinel.enabled=true", "--set", "redis.minReplicas=0"), "0"),
    (("--set", "redis.sentinel.enabled=true", "--set", "redis.sentinel.replicas=4",
      "--set", "redis.minReplicas=4"), "4"),
    (("--set", "redis.builtin=false", "--set", "redis.externalUrl=redis://r.example:6379/0",
      "--set", "redis.minReplicas=1"), "1"),  # a managed Redis with replicas, no sentinels
])
def test_admissions_wait_for_the_replicas_asked_for(
        extra: tuple[str, ...], expected: str | None) -> None:
    env = _batcher_env(render("values.yaml", *extra))
    assert env.get("FERRY_REDIS_MIN_REPLICAS") == expected
    assert env.get("FERRY_REDIS_WAIT_MS") == (None if expected is None else "500")
    assert ("FERRY_REDIS_SENTINELS" in env) is ("redis.sentinel.enabled=true" in extra)


def test_only_ferry_and_the_group_itself_reach_its_nodes_and_sentinels(
        rendered: dict[str, Path]) -> None:
    items = by_kind(rendered["redis-sentinel"].read_text())
    for name, port in (("ferry-redis", "redis"), ("ferry-redis-sentinel", "sentinel")):
        (rule,) = items[("NetworkPolicy", name)]["spec"]["ingress"]
        assert {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
                for p in rule["from"]} == {"gateway", "batcher", "redis", "redis-sentinel"}
        assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
    default = by_kind(rendered["values.yaml"].read_text())
    assert ("NetworkPolicy", "ferry-redis-sentinel") not in default
    (rule,) = default[("NetworkPolicy", "ferry-redis")]["spec"]["ingress"]
    assert len(rule["from"]) == 2  # the single Redis: the gateway and the batchers only


def test_the_inference_log_reaches_the_batchers_and_its_logger(
        rendered: dict[str, Path]) -> None:
    """Off by default; on, the batchers hand records to it and a logger Deployment writes them
    to a volume (or a bucket, its credentials a mounted Secret), reaching Redis through the
    network policy, its metrics scraped, its probes on them."""
    default = by_kind(rendered["values.yaml"].read_text())
    assert not [name for kind, name in default if "logger" in name]
    assert "FERRY_LOG_MODELS" not in _batcher_env(rendered["values.yaml"].read_text())
    manifest = rendered["inference-log"].read_text()
    items = by_kind(manifest)
    env = _batcher_env(manifest)
    assert (env["FERRY_LOG_MODELS"], env["FERRY_LOG_REDACT"], env["FERRY_LOG_MAX_RECORDS"]) == (
        "moderation=0.1,sim=1", "password,ssn", "100000")
    pod = items[("Deployment", "ferry-logger")]["spec"]["template"]["spec"]
    logger = _container_env(pod)
    assert pod["containers"][0]["args"] == ["logger"]
    assert logger["FERRY_LOG_MODELS"] == env["FERRY_LOG_MODELS"]
    assert logger["FERRY_LOG_SINK"] == "/var/lib/ferry/inference-log"
    assert logger["FERRY_REDIS_URL"] == env["FERRY_REDIS_URL"]
    assert {"name": "inference-log", "mountPath": "/var/lib/ferry/inference-log"} in pod[
        "containers"][0]["volumeMounts"]
    claim = items[("PersistentVolumeClaim", "ferry-inference-log")]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert pod["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/readyz",
                                                                 "port": "metrics"}
    (rule,) = items[("NetworkPolicy", "ferry-redis")]["spec"]["ingress"]
    assert {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
            for p in rule["from"]} == {"gateway", "batcher", "logger"}
    assert items[("Service", "ferry-logger")]["spec"]["ports"][0]["name"] == "metrics"
    s3 = by_kind(rendered["inference-log-s3"].read_text())
    pod = s3[("Deployment", "ferry-logger")]["spec"]["template"]["spec"]
    logger = _container_env(pod)
    assert logger["FERRY_LOG_SINK"] == "s3://shelf/log"
    assert logger["FERRY_S3_SECRET_ACCESS_KEY_FILE"] == \
        "/var/run/secrets/ferry/s3/AWS_SECRET_ACCESS_KEY"
    assert ("PersistentVolumeClaim", "ferry-inference-log") not in s3
    assert {"name": "s3", "secret": {"secretName": "shelf-s3", "defaultMode": 0o400}} in pod[
        "volumes"]
    (rule,) = s3[("NetworkPolicy", "ferry-redis-sentinel")]["spec"]["ingress"]
    assert "logger" in {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
                        for p in rule["from"]}
