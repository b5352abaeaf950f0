"""The deployment files in deploy/, checked offline without a container runtime or a cluster: the
compose file against the Compose Specification's schema (check-jsonschema), the Kubernetes
manifests against Kubernetes 1.37.0's schemas (kubernetes-validate --strict; the RayJob's pod
templates as Pods, its own fields here), the Ray cluster launcher config with Ray's own validator,
and the rules the files promise: ports published on loopback only, secrets from .env or Secrets
only, pinned versions that match pyproject.toml, specs that load. Broken copies must fail."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
K8S = DEPLOY / "k8s"
KUEUE = K8S / "kueue"
K8S_VERSION = "1.37.0"
# every manifest kubernetes-validate knows (not the kustomization, not KubeRay's custom resource)
MANIFESTS = sorted(p.name for p in K8S.glob("*.yaml") if p.name not in ("kustomization.yaml", "rayjob.yaml"))
# a value that only names a variable, with no default: compose stops if .env lacks it
REQUIRED_VAR = re.compile(r"\$\{[A-Z][A-Z0-9_]*:\?[^}]*\}")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY")


def tool(name: str, *args: str) -> subprocess.CompletedProcess:
    """Run a validator's module with this interpreter (its console script sits beside it)."""
    return subprocess.run([sys.executable, "-m", name, *args], capture_output=True, text=True, timeout=120)


def kubernetes_validate(path: Path) -> subprocess.CompletedProcess:
    return tool("kubernetes_validate", "--strict", "-k", K8S_VERSION, str(path))


def compose_validate(path: Path) -> subprocess.CompletedProcess:
    return tool("check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path))


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def strings(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """Every string in a YAML tree, with the keys and indices that lead to it."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from strings(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from strings(value, path + (i,))
    elif isinstance(node, str):
        yield path, node


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def rayjob() -> dict[str, Any]:
    (doc,) = load_all(K8S / "rayjob.yaml")
    return doc


def pod_templates() -> dict[str, dict[str, Any]]:
    """Every pod template in deploy/k8s: the Jobs' and the RayJob's head and worker groups."""
    jobs = (K8S / "worker-job.yaml", K8S / "sweep-job.yaml", K8S / "queue-workers.yaml", KUEUE / "sweep-job.yaml")
    templates = {f"{p.parent.name}/{p.stem}": load_all(p)[0]["spec"]["template"] for p in jobs}
    cluster = rayjob()["spec"]["rayClusterSpec"]
    templates["rayjob-head"] = cluster["headGroupSpec"]["template"]
    for group in cluster["workerGroupSpecs"]:
        templates[f"rayjob-{group['groupName']}"] = group["template"]
    return templates


# --- compose -----------------------------------------------------------------------------------


def test_compose_file_follows_the_compose_specification():
    result = compose_validate(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_key_in_a_compose_service_is_refused(tmp_path: Path):
    broken = tmp_path / "compose.yaml"
    text = COMPOSE.read_text()
    assert "\n  worker:\n" in text
    broken.write_text(text.replace("\n  worker:\n", "\n  worker:\n    restart_policy: always\n", 1))
    result = compose_validate(broken)
    assert result.returncode != 0
    assert "restart_policy" in result.stdout + result.stderr


def test_compose_publishes_ports_on_loopback_only():
    published = {name: service.get("ports", []) for name, service in compose()["services"].items()}
    assert published["mlflow"] and published["optuna-dashboard"]
    assert not published["postgres"] and not published["minio"]
    loopback = re.compile(r"(127\.0\.0\.1|\$\{[A-Z]+_BIND:-127\.0\.0\.1\}):")
    for name, ports in published.items():
        for port in ports:
            assert isinstance(port, str) and loopback.match(port), f"{name} publishes {port!r} beyond loopback"
    # and the .env.example defaults keep them there
    env = env_example()
    binds = {k: v for k, v in env.items() if k.endswith("_BIND")}
    assert binds == {"MLFLOW_BIND": "127.0.0.1", "DASHBOARD_BIND": "127.0.0.1"}


def test_compose_services_have_health_checks_restart_policies_and_wait_for_health():
    services = compose()["services"]
    for name, service in services.items():
        assert "restart" in service, name
        if name != "minio-init":  # one-shot: dependants wait for it to complete instead
            assert "healthcheck" in service, name
        for dependency, how in service.get("depends_on", {}).items():
            expected = "service_completed_successfully" if dependency == "minio-init" else "service_healthy"
            assert how == {"condition": expected}, (name, dependency)
    worker = services["worker"]
    assert worker["command"][:2] == ["worker", "/spec/spec.yaml"] and "./config:/spec:ro" in worker["volumes"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert "container_name" not in worker  # --scale worker=N needs generated names
    assert services["sweep"]["command"][:2] == ["run", "/spec/spec.yaml"]
    # the queue's pool: scaled like the workers, serving the queue in the studies database
    pool = services["queue-worker"]
    assert pool["command"][:3] == ["worker", "--queue", "postgresql+psycopg://sweeper@postgres:5432/optuna"]
    assert pool["profiles"] == ["queue"] and "container_name" not in pool and pool["deploy"] == worker["deploy"]
    assert "sweep-runs:/work/runs" in pool["volumes"]  # one folder: the finisher's summary, preempted states
    mlflow = " ".join(services["mlflow"]["command"])
    for option in (
        "--app-name=basic-auth",
        "--allowed-hosts=",
        "--backend-store-uri=postgresql+psycopg://",
        "--artifacts-destination=s3://",
    ):
        assert option in mlflow
    assert "--no-serve-artifacts" not in mlflow  # proxied: only the server holds the S3 keys


def test_compose_takes_every_secret_from_env_and_env_is_ignored_by_git():
    tree = compose()
    for name, service in tree["services"].items():
        for key, value in service.get("environment", {}).items():
            if SECRET_NAME.search(key):
                assert REQUIRED_VAR.fullmatch(str(value)), (
                    f"{name}: {key} must come from .env as ${{VAR:?...}}, not {value!r}"
                )
        # workers and the sweep hold no S3 keys and no store URL: artifacts go through the server
        if name in ("worker", "sweep"):
            assert not any(k.startswith("AWS_") for k in service["environment"]), name
    assert not re.search(r"://[^/\s@:]+:[^/\s@]*@", COMPOSE.read_text()), "a password in a URL"
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/compose/.env"], cwd=REPO)
    assert ignored.returncode == 0, "deploy/compose/.env must be ignored by git"


def env_example() -> dict[str, str]:
    lines = (DEPLOY / "compose" / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def test_env_example_defines_every_variable_compose_uses():
    # from the parsed file (comments may mention ${VAR}); $$ is compose's escape for a literal $
    used = {
        name for _, value in strings(compose()) for name in re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", value)
    }
    assert used, "compose.yaml uses no variables?"
    defined = env_example()
    assert sorted(used - set(defined)) == []
    assert sorted(set(defined) - used) == []  # nothing stale either


def test_the_compose_spec_is_digits_with_shared_storage_and_tracking():
    from sweeper.spec.load import load

    digits = load(REPO / "search_spaces" / "digits.yaml").model_dump()
    spec = load(DEPLOY / "compose" / "config" / "spec.yaml")
    assert spec.search.storage == "postgresql+psycopg://sweeper@postgres:5432/optuna"
    assert spec.tracking.mlflow_uri == "http://mlflow:5000"
    same = spec.model_dump()
    same["search"]["storage"], same["tracking"]["mlflow_uri"] = None, None
    assert same == digits, "the spec differs from search_spaces/digits.yaml beyond storage and tracking"


def test_the_configmap_spec_loads_for_both_backends(tmp_path: Path):
    from sweeper.spec.load import load

    digits = load(REPO / "search_spaces" / "digits.yaml").model_dump()
    path = tmp_path / "spec.yaml"
    path.write_text(load_all(K8S / "configmap-spec.yaml")[0]["data"]["spec.yaml"])
    spec = load(path)
    assert re.fullmatch(r"postgresql\+psycopg://sweeper@postgres\.sweeper\.svc:5432/optuna", spec.search.storage)
    assert spec.tracking.mlflow_uri == "http://mlflow.sweeper.svc:5000"
    same = spec.model_dump()
    same["search"]["storage"], same["tracking"]["mlflow_uri"] = None, None
    assert same == digits
    # the RayJob's entrypoint: the same file, switched to the Ray backend by its overrides
    args = shlex.split(rayjob()["spec"]["entrypoint"])
    assert args[:3] == ["sweeper", "run", "/spec/spec.yaml"]
    ray = load(path, [a for a in args[3:] if "=" in a and not a.startswith("-")])
    assert ray.search.backend == "ray" and ray.search.storage is None
    assert ray.search.ray.storage_path.startswith("s3://")


# --- Kubernetes --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_validates_strictly_against_kubernetes(name: str):
    result = kubernetes_validate(K8S / name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout


def test_a_misspelt_field_in_a_manifest_is_refused(tmp_path: Path):
    (job,) = load_all(K8S / "worker-job.yaml")
    job["spec"]["parallelizm"] = job["spec"].pop("parallelism")
    broken = tmp_path / "worker-job.yaml"
    broken.write_text(yaml.safe_dump(job))
    result = kubernetes_validate(broken)
    assert result.returncode != 0
    assert "parallelizm" in result.stdout + result.stderr


# (ids without "gpu": conftest skips tests with that keyword where there is no CUDA device)
@pytest.mark.parametrize("name", ["head", "worker-group-0"])
def test_rayjob_pod_templates_validate_as_pods(name: str, tmp_path: Path):
    cluster = rayjob()["spec"]["rayClusterSpec"]
    groups = {
        "head": cluster["headGroupSpec"],
        **{f"worker-group-{i}": g for i, g in enumerate(cluster["workerGroupSpecs"])},
    }
    template = groups[name]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template.get("metadata", {}), "name": f"rayjob-{name}"},
        "spec": template["spec"],
    }
    path = tmp_path / f"pod-{name}.yaml"
    path.write_text(yaml.safe_dump(pod))
    result = kubernetes_validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rayjob_fields():
    job = rayjob()
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert shlex.split(spec["entrypoint"])[:2] == ["sweeper", "run"] and "search.backend=ray" in spec["entrypoint"]
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert head["template"]["spec"]["containers"]
    assert head["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    assert cluster["authOptions"] == {"mode": "token", "secretName": "ray-auth"}
    assert spec["submissionMode"] == "SidecarMode"  # the submitter reaches the dashboard on loopback
    workers = [c for g in cluster["workerGroupSpecs"] for c in g["template"]["spec"]["containers"]]
    assert workers and all(c["resources"]["limits"]["nvidia.com/gpu"] == 1 for c in workers)
    images = {c["image"] for t in pod_templates().values() for c in t["spec"]["containers"]}
    assert images == {"registry.example.invalid/sweeper:0.1.0-cuda"}  # pinned, the same everywhere


def test_no_service_is_exposed_outside_the_cluster():
    for path in [*K8S.glob("*.yaml"), *KUEUE.glob("*.yaml"), *(DEPLOY / "ray").glob("*.yaml")]:
        for doc in load_all(path):
            for keys, value in strings(doc):
                if keys and keys[-1] == "type" and "service" in "".join(map(str, keys)).lower():
                    assert value not in ("LoadBalancer", "NodePort"), (path.name, keys)
            if doc.get("kind") == "Service":
                assert doc["spec"].get("type", "ClusterIP") == "ClusterIP", path.name
        assert not re.search(
            r"\b(LoadBalancer|NodePort)\b",
            "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")),
        ), path.name


def test_pods_run_as_non_root_on_a_read_only_root_with_secrets_from_secrets():
    for name, template in pod_templates().items():
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in spec["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False, name
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            for writable in ("/work", "/tmp"):
                assert "emptyDir" in volumes[mounts[writable]], (name, writable)
            assert "limits" in container["resources"] and "requests" in container["resources"], name
            for variable in container.get("env", []):
                if SECRET_NAME.search(variable["name"]):
                    assert "secretKeyRef" in variable.get("valueFrom", {}), (name, variable["name"])
    (worker,) = load_all(K8S / "worker-job.yaml")
    assert worker["spec"]["parallelism"] == worker["spec"]["completions"] == 4 and "backoffLimit" in worker["spec"]
    container = worker["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["worker", "/spec/spec.yaml"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_the_queue_workers_serve_the_queue_and_kueue_queues_each_sweep_job():
    (pool,) = load_all(K8S / "queue-workers.yaml")
    container = pool["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["worker", "--queue"] and container["args"][2].startswith("postgresql+psycopg://")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1 and pool["spec"]["replicas"] >= 2
    # Kueue's objects (custom resources: their fields checked here) and the Job they admit
    kinds = {d["kind"]: d for d in load_all(KUEUE / "queues.yaml")}
    priorities = {
        d["metadata"]["name"] for d in load_all(KUEUE / "queues.yaml") if d["kind"] == "WorkloadPriorityClass"
    }
    assert {d["apiVersion"] for d in load_all(KUEUE / "queues.yaml")} == {"kueue.x-k8s.io/v1beta2"}
    queue, cluster = kinds["LocalQueue"], kinds["ClusterQueue"]
    assert queue["spec"]["clusterQueue"] == cluster["metadata"]["name"] and queue["metadata"]["namespace"] == "sweeper"
    flavor = cluster["spec"]["resourceGroups"][0]["flavors"][0]
    assert flavor["name"] == kinds["ResourceFlavor"]["metadata"]["name"]
    assert {r["name"]: r["nominalQuota"] for r in flavor["resources"]}["nvidia.com/gpu"] == 8
    assert cluster["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority" and len(priorities) == 2
    (job,) = load_all(KUEUE / "sweep-job.yaml")
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == queue["metadata"]["name"]
    assert labels["kueue.x-k8s.io/priority-class"] in priorities and job["spec"]["suspend"] is True
    result = kubernetes_validate(KUEUE / "sweep-job.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_kustomization_lists_every_manifest_and_names_the_kubernetes_version():
    text = (K8S / "kustomization.yaml").read_text()
    assert K8S_VERSION in text
    resources = yaml.safe_load(text)["resources"]
    expected = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert sorted(resources) == sorted(expected)


# --- Ray ---------------------------------------------------------------------------------------


def test_ray_cluster_launcher_config_passes_rays_validator():
    # what `ray up` does before it touches a machine; in a subprocess: importing ray here would fix
    # this process's Ray auth mode before tests/test_ray.py sets its token (Ray reads it once)
    check = (
        "import sys, yaml\nfrom ray.autoscaler._private.util import prepare_config, validate_config\n"
        "validate_config(prepare_config(yaml.safe_load(open(sys.argv[1]))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", check, str(DEPLOY / "ray" / "cluster.yaml")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    config = yaml.safe_load((DEPLOY / "ray" / "cluster.yaml").read_text())
    head = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host 127.0.0.1" in head
    setup = " ".join(config["setup_commands"])
    assert "git+" not in setup and "-c " in setup and "constraints.txt" in setup
    assert re.search(r"sweeper-0\.1\.0-py3-none-any\.whl|sweeper==0\.1\.0", setup)


def test_kuberay_cluster_keeps_its_dashboard_on_loopback():
    (cluster,) = load_all(DEPLOY / "ray" / "kuberay-raycluster.yaml")
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"


def test_nothing_in_deploy_listens_on_all_interfaces_but_compose_services_in_their_network():
    for path in sorted(DEPLOY.rglob("*")):
        if not path.is_file() or path.suffix == ".md":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split(" #")[0] if not line.lstrip().startswith("#") else ""
            if "0.0.0.0" in code:
                assert path == COMPOSE, f"{path.relative_to(REPO)}:{number} binds 0.0.0.0: {line.strip()}"
    # in compose: only the listen address of a service's command inside the project network
    for keys, value in strings(compose()):
        if "0.0.0.0" in value:
            assert keys[0] == "services" and keys[2] == "command", keys


# --- the image ---------------------------------------------------------------------------------


def constraints() -> dict[str, str]:
    pins = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def image_requirements() -> list[str]:
    """What the Dockerfile's builder installs: its own script (the RUN heredoc), run on pyproject.toml."""
    text = (DEPLOY / "Dockerfile").read_text()
    script = re.search(r"^RUN python - > requirements\.txt <<'EOF'\n(.*?)^EOF$", text, re.M | re.S)
    assert script, "the Dockerfile's requirements script"
    result = subprocess.run(
        [sys.executable, "-"], input=script.group(1), cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.split()


def test_constraints_pin_what_pyproject_allows_and_what_the_tests_run_with():
    from importlib import metadata

    pins = constraints()
    requirements = image_requirements()
    names = {canonicalize_name(Requirement(line).name) for line in requirements}
    assert {"torch", "mlflow", "ray", "psycopg", "boto3", "optuna-dashboard"} <= names and "sweeper" not in names
    for line in requirements:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned in deploy/constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is not in {requirement}"
        )
    assert "sweeper" not in pins
    # the image runs what the suite tested where the choice matters most; the others need only be
    # allowed by pyproject.toml (a registry's newer patch release must not turn CI red)
    for name in ("torch", "torchvision", "mlflow", "ray"):
        assert pins[name] == metadata.version(name), (
            f"{name}: pinned {pins[name]}, tested with {metadata.version(name)}"
        )


def test_dockerfile_builds_from_the_pins_as_a_non_root_image():
    text = (DEPLOY / "Dockerfile").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", code, re.M)
    assert [alias for _, alias in stages] == ["base-cpu", "base-cuda", "base", "builder", "runtime"]
    assert ("python:3.11-slim-bookworm", "base-cpu") in stages
    assert re.search(r"^ARG CUDA_BASE=nvidia/cuda:13\.0\.\d+-cudnn-runtime-ubuntu24\.04$", code, re.M)
    assert "https://download.pytorch.org/whl/cpu" in code
    assert (
        "-c constraints.txt" in code and "pip wheel --no-deps -w /build/dist ." in code
    )  # tests/test_wheel.py's wheel
    assert "pip install --no-deps /build/dist/sweeper-*.whl" in code
    assert not re.search(r"^COPY\s+\.\s", code, re.M), "copy named paths only (no .dockerignore)"
    assert "COPY --from=builder /opt/venv /opt/venv" in code
    assert re.search(r"^USER 10001:10001$", code, re.M) and "--uid 10001" in code
    assert re.search(r"^WORKDIR /work$", code, re.M)
    assert re.search(r'^ENTRYPOINT \["sweeper"\]$', code, re.M) and re.search(r'^CMD \["--help"\]$', code, re.M)
    assert re.search(r"^HEALTHCHECK .*\n?.*import sweeper\.cli", code, re.M)
    subprocess.run([sys.executable, "-c", "import sweeper.cli"], check=True, timeout=60)  # the check itself works
