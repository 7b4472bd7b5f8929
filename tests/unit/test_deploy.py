"""deploy/ agrees with itself and with eyas: one image, one entry point, one tracking URI, GPU
counts that match, Ray and MLflow versions that match pyproject, and overrides that compose."""
from __future__ import annotations

import copy
import re
import shlex
import tomllib
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import ray
import yaml
from packaging.requirements import Requirement

from workflows.config import load_config
from workflows.stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
VERSION = PYPROJECT["version"]
IMAGE = f"registry.example.com/eyas:{VERSION}"
ENTRY = ["python", "-m", "workflows.pipeline"]


def _pin(name: str, reqs=None) -> Requirement:
    reqs = PYPROJECT["dependencies"] if reqs is None else reqs
    return next(r for r in map(Requirement, reqs) if r.name == name)


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _one(path: Path, kind: str, name: str | None = None) -> dict:
    found = [d for d in _docs(path) if d.get("kind") == kind
             and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, (path, kind, name, len(found))
    return found[0]


def _flag(args: list[str], flag: str) -> str:
    """The value of --flag=VALUE or --flag VALUE in an argument list."""
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag:
            return args[i + 1]
    raise AssertionError(f"{flag} not in {args}")


def _host_allowed(host: str, allowed: str) -> bool:  # MLflow's own rule: exact, or fnmatch on '*'
    return any(fnmatch(host, a) if "*" in a else host == a for a in allowed.split(","))


@pytest.fixture(scope="module")
def cluster() -> dict:
    return _one(DEPLOY / "kuberay" / "raycluster.yaml", "RayCluster")


@pytest.fixture(scope="module")
def rayjob() -> dict:
    return _one(DEPLOY / "kuberay" / "rayjob.yaml", "RayJob")


@pytest.fixture(scope="module")
def launcher() -> dict:
    return yaml.safe_load((DEPLOY / "cluster-launcher.yaml").read_text())


@pytest.fixture(scope="module")
def mlflow_k8s() -> Path:
    return DEPLOY / "mlflow" / "kubernetes.yaml"


def _ray_containers(spec: dict) -> list[dict]:
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_every_yaml_in_deploy_parses():
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    names = {str(f.relative_to(DEPLOY)) for f in files}
    assert {"kuberay/raycluster.yaml", "kuberay/rayjob.yaml", "kuberay/shared-storage.yaml",
            "cluster-launcher.yaml", "mlflow/docker-compose.yaml",
            "mlflow/kubernetes.yaml"} <= names
    for f in files:
        docs = _docs(f)
        assert docs and all(isinstance(d, dict) for d in docs), f
        for d in docs:
            if "kind" in d:  # Kubernetes objects
                assert d["apiVersion"] and d["metadata"]["name"], f


def test_one_image_everywhere(cluster, rayjob, launcher):
    images = {c["image"] for c in _ray_containers(cluster["spec"])}
    images |= {c["image"] for c in _ray_containers(rayjob["spec"]["rayClusterSpec"])}
    images.add(launcher["docker"]["image"])
    assert images == {IMAGE}
    dockerfile = (DEPLOY / "image" / "Dockerfile").read_text()
    assert f"docker build -f deploy/image/Dockerfile -t {IMAGE} ." in dockerfile
    assert f"-t {IMAGE} ." in (DEPLOY / "README.md").read_text()


def test_rayjob_runs_the_raycluster_spec(cluster, rayjob):
    assert rayjob["spec"]["rayClusterSpec"] == cluster["spec"]
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True


def test_ray_version_and_token_auth(cluster, launcher):
    assert str(_pin("ray").specifier) == f"=={ray.__version__}"
    assert cluster["spec"]["rayVersion"] == ray.__version__
    auth = cluster["spec"]["authOptions"]
    assert auth == {"mode": "token", "secretName": "eyas-ray-auth"}
    assert "--env RAY_AUTH_MODE=token" in launcher["docker"]["run_options"]
    assert launcher["file_mounts"] == {"~/.ray/auth_token": "~/.ray/auth_token"}


def test_gpus_in_ray_match_gpus_in_kubernetes_and_the_launcher(cluster, launcher):
    spec = cluster["spec"]
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    for c in head["template"]["spec"]["containers"]:
        assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    assert spec["workerGroupSpecs"], "no GPU worker group"
    for group in spec["workerGroupSpecs"]:
        gpus = int(group["rayStartParams"]["num-gpus"])
        (worker,) = group["template"]["spec"]["containers"]
        assert int(worker["resources"]["limits"]["nvidia.com/gpu"]) == gpus == 8
        assert int(worker["resources"]["requests"]["nvidia.com/gpu"]) == gpus
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    types = launcher["available_node_types"]
    assert types[launcher["head_node_type"]]["resources"] == {"CPU": 0}
    assert head["rayStartParams"]["num-cpus"] == "0"  # the head runs no tasks in either
    gpu_types = [t for t in types.values() if t["resources"].get("GPU")]
    assert [t["resources"]["GPU"] for t in gpu_types] == [8]


def test_every_ray_pod_gets_the_tracking_uri_and_the_shared_volume(cluster, mlflow_k8s):
    configmap = _one(mlflow_k8s, "ConfigMap", "eyas-mlflow")
    for c in _ray_containers(cluster["spec"]):
        (env,) = [e for e in c["env"] if e["name"] == "MLFLOW_TRACKING_URI"]
        ref = env["valueFrom"]["configMapKeyRef"]
        assert ref["name"] == configmap["metadata"]["name"]
        assert ref["key"] in configmap["data"]
        assert {"name": "shared", "mountPath": "/shared"} in c["volumeMounts"], c["name"]
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    shared_pvc = _one(DEPLOY / "kuberay" / "shared-storage.yaml", "PersistentVolumeClaim")
    assert shared_pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for g in groups:
        (volume,) = [v for v in g["template"]["spec"]["volumes"] if v["name"] == "shared"]
        assert volume["persistentVolumeClaim"]["claimName"] == shared_pvc["metadata"]["name"]


def test_tracking_uri_names_the_mlflow_service_and_the_server_answers_it(mlflow_k8s):
    uri = urlsplit(_one(mlflow_k8s, "ConfigMap", "eyas-mlflow")["data"]["MLFLOW_TRACKING_URI"])
    service = _one(mlflow_k8s, "Service", uri.hostname)
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == uri.port]
    server = _one(mlflow_k8s, "Deployment", "mlflow")
    pod = server["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    (named,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    args = container["command"]
    assert args[:2] == ["mlflow", "server"]
    assert int(_flag(args, "--port")) == named["containerPort"]
    assert _flag(args, "--host") == "0.0.0.0"
    assert _host_allowed(uri.netloc, _flag(args, "--allowed-hosts"))
    assert _host_allowed(f"{uri.hostname}.eyas.svc.cluster.local:{uri.port}",
                         _flag(args, "--allowed-hosts"))
    assert not _host_allowed(f"attacker.example:{uri.port}", _flag(args, "--allowed-hosts"))
    # the database: the backend URI's host is the postgres service, the password its secret
    backend = urlsplit(_flag(args, "--backend-store-uri"))
    assert backend.scheme == "postgresql" and backend.password == "$(POSTGRES_PASSWORD)"
    db_service = _one(mlflow_k8s, "Service", backend.hostname)
    assert [p["port"] for p in db_service["spec"]["ports"]] == [backend.port]
    db = _one(mlflow_k8s, "Deployment", "mlflow-postgres")["spec"]["template"]["spec"]
    db_env = {e["name"]: e for e in db["containers"][0]["env"]}
    assert db_env["POSTGRES_USER"]["value"] == backend.username
    assert db_env["POSTGRES_DB"]["value"] == backend.path.lstrip("/")
    server_env = {e["name"]: e for e in container["env"]}
    assert server_env["POSTGRES_PASSWORD"]["valueFrom"] == db_env["POSTGRES_PASSWORD"]["valueFrom"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert _flag(args, "--artifacts-destination") in mounts and "--serve-artifacts" in args


def test_compose_server_answers_the_launcher_nodes(launcher):
    compose = yaml.safe_load((DEPLOY / "mlflow" / "docker-compose.yaml").read_text())
    mlflow = compose["services"]["mlflow"]
    args = mlflow["command"]
    (uri,) = [o.split("MLFLOW_TRACKING_URI=", 1)[1] for o in launcher["docker"]["run_options"]
              if "MLFLOW_TRACKING_URI=" in o]
    uri = urlsplit(uri)
    assert mlflow["ports"] == [f"{uri.port}:{_flag(args, '--port')}"]
    assert _host_allowed(uri.netloc, _flag(args, "--allowed-hosts"))
    assert _host_allowed(f"localhost:{uri.port}", _flag(args, "--allowed-hosts"))
    backend = urlsplit(_flag(args, "--backend-store-uri"))
    assert backend.hostname in compose["services"] and backend.scheme == "postgresql"
    pg_env = compose["services"]["postgres"]["environment"]
    assert (pg_env["POSTGRES_USER"], pg_env["POSTGRES_DB"]) == \
        (backend.username, backend.path.lstrip("/"))
    volumes = {v.split(":")[1] for v in mlflow["volumes"]}
    assert _flag(args, "--artifacts-destination") in volumes and "--serve-artifacts" in args


def test_mlflow_server_version_is_the_clients(mlflow_k8s):
    version = str(_pin("mlflow").specifier).removeprefix("==")
    image = f"registry.example.com/eyas-mlflow:{version}"
    compose = yaml.safe_load((DEPLOY / "mlflow" / "docker-compose.yaml").read_text())
    assert compose["services"]["mlflow"]["image"] == image
    server = _one(mlflow_k8s, "Deployment", "mlflow")["spec"]["template"]["spec"]
    assert server["containers"][0]["image"] == image
    dockerfile = (DEPLOY / "mlflow" / "Dockerfile").read_text()
    assert f'"mlflow[db]=={version}"' in dockerfile and f"-t {image} deploy/mlflow" in dockerfile


def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())  # join continued lines
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), " ".join(rest.split())))
    return out


def test_dockerfile_installs_eyas_with_vllm():
    steps = _dockerfile_instructions(DEPLOY / "image" / "Dockerfile")
    froms = [v for k, v in steps if k == "FROM"]
    assert len(froms) == 1 and froms[0].startswith("nvidia/cuda:")
    workdir = [v for k, v in steps if k == "WORKDIR"]
    assert workdir == ["/app/eyas"]
    copied = {v.split()[0] for k, v in steps if k == "COPY"}
    packages = {p.split(".")[0] for p in
                tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                ["packages"]["find"]["include"]}
    # installed (eyas) or imported from the checkout on PYTHONPATH (workflows, tasks)
    assert packages | {"tasks", "workflows", "conf", "pyproject.toml"} <= copied
    assert ("ENV", "PYTHONPATH=/app/eyas") in steps
    runs = [v for k, v in steps if k == "RUN"]
    (install,) = [r for r in runs if "pip install -e '.[vllm]'" in r]
    pins = dict(re.findall(r"\b(torch|vllm)==([\w.]+)", install))
    assert pins.keys() == {"torch", "vllm"}
    assert _pin("torch").specifier.contains(pins["torch"])
    assert _pin("vllm", PYPROJECT["optional-dependencies"]["vllm"]).specifier.contains(pins["vllm"])
    (heavy,) = [r for r in runs if "pip install torch==" in r]  # the cached layer, same pins
    assert f"torch=={pins['torch']}" in heavy and f"vllm=={pins['vllm']}" in heavy
    assert f'"ray[default]=={ray.__version__}"' in heavy
    assert f"mlflow{_pin('mlflow').specifier}" in heavy
    assert any("python3.11 -m venv" in r for r in runs)
    assert "/opt/venv/bin" in next(v for k, v in steps if k == "ENV" and v.startswith("PATH="))


def test_rayjob_entrypoint_composes_with_the_config_loader(rayjob, cluster, mlflow_k8s,
                                                           monkeypatch):
    uri = _one(mlflow_k8s, "ConfigMap", "eyas-mlflow")["data"]["MLFLOW_TRACKING_URI"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # what the pods get from the ConfigMap
    argv = shlex.split(rayjob["spec"]["entrypoint"])
    assert argv[:3] == ENTRY
    cfg = load_config(argv[3:])
    assert cfg.mlflow.tracking_uri == uri
    assert cfg.run_dir.startswith("/shared/eyas/")
    assert cfg.target.path.startswith("/shared/") and cfg.data.train_files[0].startswith("/shared/")
    assert cfg.stages and set(cfg.stages) <= set(STAGES)
    gpus = sum(int(g["rayStartParams"]["num-gpus"]) * g["replicas"]
               for g in cluster["spec"]["workerGroupSpecs"])
    assert cfg.extract.num_replicas * cfg.extract.gpus_per_replica == gpus
    assert cfg.train.num_workers == gpus


def test_launcher_config_passes_rays_own_validation(launcher):
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(launcher)))
    assert launcher["docker"]["image"] == IMAGE
    assert "-v /shared:/shared" in launcher["docker"]["run_options"]


def _bash_blocks(text: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    return [re.sub(r"\\\n\s*", " ", b) for b in blocks]


def _pipeline_commands(text: str) -> list[list[str]]:
    out = []
    for block in _bash_blocks(text):
        for line in block.splitlines():
            if "workflows.pipeline" in line:
                argv = shlex.split(line.split(" -- ", 1)[-1].split("#")[0])
                assert argv[:3] == ENTRY, line
                out.append(argv[3:])
    return out


@pytest.mark.parametrize("doc", ["README.md", "deploy/README.md"])
def test_cluster_docs_name_real_files_and_commands_that_compose(doc, cluster, monkeypatch):
    text = (ROOT / doc).read_text()
    if doc == "README.md":
        text = text[text.index("## On a cluster"):]
        text = text[:text.index("\n## ", 3)]
        assert "<!-- cluster-submit -->" in text and IMAGE in text
    commands = "\n".join(_bash_blocks(text))
    for path in re.findall(r"-f (\S+\.ya?ml|\S+/Dockerfile)", commands):
        assert (ROOT / path).exists(), path
    for path in re.findall(r"`([\w.-]+/[\w./-]*(?:\.ya?ml|\.md|\.py|Dockerfile))`", text):
        assert (ROOT / path).exists() or (DEPLOY / path).exists(), path
    if "port-forward svc/" in commands:
        assert f"svc/{cluster['metadata']['name']}-head-svc 8265:8265" in commands
    secret = cluster["spec"]["authOptions"]["secretName"]
    assert f"secret {secret} " in commands or "get-auth-token" in commands
    submits = [line for line in commands.splitlines() if "ray job submit" in line]
    assert submits
    for line in submits:
        assert "--working-dir . --" in line and "--address http://127.0.0.1:8265" in line
    assert "RAY_AUTH_MODE=token" in commands
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    for args in _pipeline_commands(text):
        cfg = load_config(args)
        assert cfg.run_dir.startswith("/shared/") and cfg.mlflow.tracking_uri
        assert cfg.target.builtin.cache_dir.startswith("/shared/") or cfg.target.path
