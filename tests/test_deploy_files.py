"""The deployment files agree with the settings and with each other.

No Docker engine or Kubernetes runs here, so this is what checks ``Dockerfile``,
``docker-compose.yml``, ``deploy/kubernetes/llgtriton.yaml`` and ``docs/deploy.md``: the compose
file against the Compose Specification (and ``docker-compose config`` where installed), and
ports, paths, environment variable names and values against ``llgtriton.settings``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from llgtriton.settings import (
    SECTIONS,
    ProxySettings,
    Settings,
    TritonSettings,
    env_name,
    load_settings,
    parse_command_line,
)

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
KUBERNETES = ROOT / "deploy" / "kubernetes" / "llgtriton.yaml"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
README = ROOT / "README.md"
CONFIGURATION_DOC = ROOT / "docs" / "configuration.md"
API_DOC = ROOT / "docs" / "api.md"

# Interpolation variables of docker-compose.yml: Compose reads them, llgtriton never does.
COMPOSE_ONLY_VARIABLES = frozenset({"LLGTRITON_MODEL_DIR", "LLGTRITON_TP", "LLGTRITON_POSTGRES_PASSWORD"})
# Services of the compose file that run someone else's image, not a stage of our Dockerfile.
THIRD_PARTY_SERVICES = {"postgres": "postgres:17"}

ENV_NAME = re.compile(r"\bLLGTRITON_[A-Z0-9_]*")
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")
LOCAL_URL = re.compile(r"http://localhost:\d+/[\w/]*")

PROXY = ProxySettings()
TRITON = TritonSettings()
TRITON_PORTS = {TRITON.http_port, TRITON.grpc_port, TRITON.metrics_port}
# Dockerfile stages and the ports each one serves to other containers.
EXPECTED_PORTS = {
    "triton": TRITON_PORTS,
    "proxy": {PROXY.port},
    "cpu": {PROXY.port},  # Triton listens on the container's loopback, behind the proxy
}
# Compose publishes the OpenAI API only: Triton's ports would bypass the proxy's keys and limits.
PUBLISHED_PORTS = {"triton": set(), "proxy": {PROXY.port}, "cpu": {PROXY.port}}
HEALTH_URLS = {
    "triton": f"http://localhost:{TRITON.http_port}/v2/health/ready",
    "proxy": f"http://localhost:{PROXY.port}/health",
    "cpu": f"http://localhost:{PROXY.port}/ready",
}


# Settings ---------------------------------------------------------------------------------------


def setting_env_names() -> frozenset[str]:
    names = {env_name(None, name) for name in Settings.model_fields if name not in SECTIONS}
    names.update(env_name(section, name) for section, model in SECTIONS.items() for name in model.model_fields)
    return frozenset(names)


def unknown_env_names(text: str) -> set[str]:
    """LLGTRITON_* names in ``text`` that are no setting; ``LLGTRITON_ENGINE_*`` is a prefix of some."""
    valid = setting_env_names()
    unknown = set()
    for name in ENV_NAME.findall(text):
        if name.endswith("_"):
            if not any(known.startswith(name) for known in valid):
                unknown.add(name)
        elif name not in valid and name not in COMPOSE_ONLY_VARIABLES:
            unknown.add(name)
    return unknown


def assert_valid_settings(environment: Mapping[str, str]) -> None:
    assert environment, "no LLGTRITON_* variables found"
    load_settings(parse_command_line([]), environment)  # raises SettingsError naming the bad value


def llgtriton_variables(environment: Mapping[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in environment.items() if k.startswith("LLGTRITON_") and v is not None}


# Dockerfile -------------------------------------------------------------------------------------


@dataclass
class Stage:
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def arguments(self, keyword: str) -> list[str]:
        return [rest for instruction, rest in self.instructions if instruction == keyword]

    def exposed_ports(self) -> set[int]:
        return {int(port.split("/")[0]) for line in self.arguments("EXPOSE") for port in line.split()}

    def environment(self) -> dict[str, str]:
        variables = {}
        for line in self.arguments("ENV"):
            for item in shlex.split(line):
                name, _, value = item.partition("=")
                variables[name] = value
        return variables

    def copy_destination(self, source: str) -> str:
        for line in self.arguments("COPY"):
            words = [word for word in shlex.split(line) if not word.startswith("--")]
            if source in words[:-1]:
                return words[-1]
        raise AssertionError(f"no COPY of {source}")

    def command(self) -> list[str]:
        (line,) = self.arguments("CMD")
        command: list[str] = json.loads(line)
        return command


def dockerfile_instructions(text: str) -> Iterator[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined and comments dropped."""
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        keyword, _, rest = (logical + line).partition(" ")
        logical = ""
        yield keyword.upper(), rest.strip()


def dockerfile_stages() -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for keyword, rest in dockerfile_instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest, re.IGNORECASE)
            assert match, f"every stage is named: FROM {rest}"
            current = stages[match[2]] = Stage(base=match[1])
        elif current is not None:
            current.instructions.append((keyword, rest))
    return stages


# Compose ----------------------------------------------------------------------------------------


def load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def all_compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = load_yaml(COMPOSE)["services"]
    return services


def compose_services() -> dict[str, dict[str, Any]]:
    """The compose services built from our Dockerfile's stages."""
    return {name: service for name, service in all_compose_services().items() if name not in THIRD_PARTY_SERVICES}


def with_defaults(value: str) -> str:
    """``value`` as Compose interpolates it with no variable set: ``${NAME:-default}`` gives the default."""
    return INTERPOLATION.sub(lambda match: match[2] or "", value)


def compose_environment(service: Mapping[str, Any]) -> dict[str, str | None]:
    environment = service.get("environment", {})
    assert isinstance(environment, dict), "environment is written as a mapping"
    return {name: None if value is None else with_defaults(str(value)) for name, value in environment.items()}


def compose_port_pairs(service: Mapping[str, Any]) -> list[tuple[int, int]]:
    pairs = []
    for entry in service.get("ports", []):
        published, _, target = str(entry).rpartition(":")
        pairs.append((int(published), int(target)))
    return pairs


def compose_volume_target(service: Mapping[str, Any], index: int) -> str:
    return str(with_defaults(service["volumes"][index]).split(":")[1])


def compose_schema() -> dict[str, Any] | None:
    """The Compose Specification schema shipped in the docker-compose 1.29.2 wheel, if installed."""
    spec = importlib.util.find_spec("compose")  # a top-level package: found without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "config" / "compose_spec.json"
    if not path.exists():
        return None
    schema: dict[str, Any] = json.loads(path.read_text())
    return schema


def docker_compose_binary() -> str | None:
    """A working docker-compose, not the dependency-less one the schema wheel puts in this venv's bin."""
    own_bin = Path(sys.prefix, "bin").resolve()
    path = os.pathsep.join(
        entry for entry in os.environ.get("PATH", "").split(os.pathsep) if entry and Path(entry).resolve() != own_bin
    )
    binary = shutil.which("docker-compose", path=path)
    if binary is None:
        return None
    probe = subprocess.run([binary, "version"], capture_output=True, timeout=60, check=False)
    return binary if probe.returncode == 0 else None


# Kubernetes -------------------------------------------------------------------------------------


def kubernetes_object(kind: str, name: str) -> dict[str, Any]:
    for document in yaml.safe_load_all(KUBERNETES.read_text()):
        if document["kind"] == kind and document["metadata"]["name"] == name:
            assert isinstance(document, dict)
            return document
    raise AssertionError(f"no {kind} {name} in {KUBERNETES.name}")


def pod_container(workload: Mapping[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def container_environment(container: Mapping[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}


def container_ports(container: Mapping[str, Any]) -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in container["ports"]}


def triton_workload() -> dict[str, Any]:
    return kubernetes_object("StatefulSet", "llgtriton-triton")


def proxy_workload() -> dict[str, Any]:
    return kubernetes_object("Deployment", "llgtriton-proxy")


# The compose file against the Compose Specification --------------------------------------------


def test_compose_file_matches_the_compose_specification() -> None:
    schema = compose_schema()
    if schema is None:
        pytest.skip("the Compose Specification schema comes from: pip install --no-deps docker-compose==1.29.2")
    from jsonschema import Draft7Validator

    validator = Draft7Validator(schema)
    errors = [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(load_yaml(COMPOSE))
    ]
    assert errors == []
    typo = load_yaml(COMPOSE)
    typo["services"]["triton"]["shm_sizes"] = "2gb"
    assert not validator.is_valid(typo), "the schema check would catch a misspelt key"


@pytest.mark.parametrize("profile", [[], ["--profile", "cpu"]], ids=["default", "cpu"])
def test_docker_compose_accepts_the_file(profile: list[str]) -> None:
    binary = docker_compose_binary()
    if binary is None:
        pytest.skip("no working docker-compose on PATH")
    # The caller's LLGTRITON_* and COMPOSE_* variables would change what is checked.
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("LLGTRITON_", "COMPOSE_"))}
    result = subprocess.run(
        [binary, "-f", str(COMPOSE), *profile, "config", "-q"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_compose_profiles_keep_the_two_stacks_apart() -> None:
    services = compose_services()
    default = {name for name, service in services.items() if not service.get("profiles")}
    assert default == {"triton", "proxy"}
    assert services["cpu"]["profiles"] == ["cpu"]
    assert "depends_on" not in services["cpu"], "`docker compose up cpu` must start cpu alone"
    assert services["proxy"]["depends_on"]["triton"]["condition"] == "service_healthy"


# Ports and health checks -------------------------------------------------------------------------


def test_the_third_party_services_run_pinned_images_and_publish_no_port() -> None:
    services = all_compose_services()
    assert {name: services[name]["image"] for name in THIRD_PARTY_SERVICES} == THIRD_PARTY_SERVICES
    assert all("ports" not in services[name] for name in THIRD_PARTY_SERVICES)


def test_every_proxy_stores_responses_in_the_composed_postgresql_once_it_is_healthy() -> None:
    services = all_compose_services()
    postgres, proxy = services["postgres"], services["proxy"]
    store = compose_environment(proxy)["LLGTRITON_PROXY_RESPONSES_STORE"]
    assert (
        store
        == f"postgresql://{postgres['environment']['POSTGRES_USER']}@postgres:5432/{postgres['environment']['POSTGRES_DB']}"
    )
    assert proxy["environment"]["PGPASSWORD"] == postgres["environment"]["POSTGRES_PASSWORD"]
    assert proxy["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]


def test_kubernetes_proxies_share_the_postgresql_that_the_manifest_runs() -> None:
    proxy = pod_container(proxy_workload())
    postgres = pod_container(kubernetes_object("StatefulSet", "llgtriton-postgres"))
    service = kubernetes_object("Service", "llgtriton-postgres")
    env = container_environment(postgres)
    port = service["spec"]["ports"][0]["port"]
    expected = f"postgresql://{env['POSTGRES_USER']}@{service['metadata']['name']}:{port}/{env['POSTGRES_DB']}"
    assert container_environment(proxy)["LLGTRITON_PROXY_RESPONSES_STORE"] == expected
    secrets = {
        item["name"]: item["valueFrom"]["secretKeyRef"]["name"]
        for item in [*proxy["env"], *postgres["env"]]
        if "valueFrom" in item
    }
    assert secrets["PGPASSWORD"] == secrets["POSTGRES_PASSWORD"] == "llgtriton-postgres"
    assert container_ports(postgres)["postgres"] == port


def test_compose_services_build_dockerfile_stages() -> None:
    stages = dockerfile_stages()
    for name, service in compose_services().items():
        assert service["build"]["target"] == name
        assert name in stages


def test_compose_ports_are_the_settings_defaults() -> None:
    for name, service in compose_services().items():
        pairs = compose_port_pairs(service)
        assert {target for _, target in pairs} == PUBLISHED_PORTS[name], name
        assert all(published == target for published, target in pairs), f"{name} publishes its ports as they are"


def test_dockerfile_exposes_the_settings_defaults() -> None:
    stages = dockerfile_stages()
    for name, ports in EXPECTED_PORTS.items():
        assert stages[name].exposed_ports() == ports, name


def test_kubernetes_ports_are_the_settings_defaults() -> None:
    assert set(container_ports(pod_container(triton_workload())).values()) == TRITON_PORTS
    assert set(container_ports(pod_container(proxy_workload())).values()) == {PROXY.port}
    headless = kubernetes_object("Service", "llgtriton-triton")
    assert {port["port"] for port in headless["spec"]["ports"]} == TRITON_PORTS
    proxy = kubernetes_object("Service", "llgtriton-proxy")
    assert [port["port"] for port in proxy["spec"]["ports"]] == [PROXY.port]


def test_health_checks_ask_the_right_ports_and_paths() -> None:
    stages = dockerfile_stages()
    for name, service in compose_services().items():
        assert LOCAL_URL.findall(" ".join(service["healthcheck"]["test"])) == [HEALTH_URLS[name]], name
        (healthcheck,) = stages[name].arguments("HEALTHCHECK")
        assert LOCAL_URL.findall(healthcheck) == [HEALTH_URLS[name]], name


@pytest.mark.parametrize(
    ("workload", "probe", "port", "path"),
    [
        ("triton", "readinessProbe", TRITON.http_port, "/v2/health/ready"),
        ("triton", "livenessProbe", TRITON.http_port, "/v2/health/live"),
        ("proxy", "readinessProbe", PROXY.port, "/ready"),
        ("proxy", "livenessProbe", PROXY.port, "/health"),
    ],
)
def test_kubernetes_probes(workload: str, probe: str, port: int, path: str) -> None:
    container = pod_container(triton_workload() if workload == "triton" else proxy_workload())
    check = container[probe]["httpGet"]
    assert check["path"] == path
    assert container_ports(container).get(check["port"], check["port"]) == port


# Environment variables -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [COMPOSE, DOCKERFILE, KUBERNETES, DEPLOY_DOC, README, CONFIGURATION_DOC, API_DOC], ids=lambda p: p.name
)
def test_every_llgtriton_variable_is_a_setting(path: Path) -> None:
    assert unknown_env_names(path.read_text()) == set()


def test_compose_only_variables_are_interpolations() -> None:
    """The whitelisted names are read by Compose, never handed to a container."""
    text = COMPOSE.read_text()
    used = {match[0] for match in INTERPOLATION.findall(text)} & COMPOSE_ONLY_VARIABLES
    assert used == COMPOSE_ONLY_VARIABLES
    for service in compose_services().values():
        assert COMPOSE_ONLY_VARIABLES.isdisjoint(service.get("environment", {}))


@pytest.mark.parametrize("name", sorted(EXPECTED_PORTS))
def test_compose_settings_values_validate(name: str) -> None:
    service = compose_services()[name]
    image = dockerfile_stages()[name].environment()
    assert_valid_settings(llgtriton_variables({**image, **compose_environment(service)}))


@pytest.mark.parametrize("name", ["triton", "cpu"])
def test_dockerfile_settings_values_validate(name: str) -> None:
    assert_valid_settings(llgtriton_variables(dockerfile_stages()[name].environment()))


@pytest.mark.parametrize("workload", ["triton", "proxy"])
def test_kubernetes_settings_values_validate(workload: str) -> None:
    container = pod_container(triton_workload() if workload == "triton" else proxy_workload())
    for item in container["env"]:
        assert isinstance(item.get("value", ""), str), f"{item['name']}: Kubernetes takes strings only"
    assert_valid_settings(llgtriton_variables(container_environment(container)))


# Paths, names and replicas ---------------------------------------------------------------------------


def test_dockerfile_model_repository_paths_agree() -> None:
    stages = dockerfile_stages()
    repository = stages["triton"].copy_destination("model_repository")
    assert f"--model-repository={repository}" in " ".join(stages["triton"].command()).split()
    cpu = stages["cpu"]
    assert cpu.environment()[env_name("triton", "model_repository")] == cpu.copy_destination("model_repository")


def test_model_mounts_are_where_the_engine_looks() -> None:
    model_variable = env_name("engine", "model")
    image_model = dockerfile_stages()["triton"].environment()[model_variable]
    triton = compose_services()["triton"]
    assert compose_volume_target(triton, 0) == compose_environment(triton)[model_variable] == image_model
    container = pod_container(triton_workload())
    (mount,) = [mount for mount in container["volumeMounts"] if mount["name"] == "model"]
    assert mount["mountPath"] == container_environment(container)[model_variable] == image_model


def test_cpu_cache_volume_is_the_engine_cache_dir() -> None:
    cache_dir = dockerfile_stages()["cpu"].environment()[env_name("engine", "cache_dir")]
    assert compose_volume_target(compose_services()["cpu"], 0) == cache_dir


def test_model_repository_serves_the_proxy_model_name() -> None:
    config = ROOT / "model_repository" / PROXY.model_name / "config.pbtxt"
    match = re.search(r'^name:\s*"([^"]+)"', config.read_text(), re.MULTILINE)
    assert match is not None
    assert match[1] == PROXY.model_name


def test_compose_proxy_reaches_triton() -> None:
    services = compose_services()
    url = compose_environment(services["proxy"])[env_name("proxy", "triton_url")]
    assert url is not None
    for entry in url.split(","):
        host, _, port = entry.rpartition(":")
        assert host in services and "profiles" not in services[host]
        assert int(port) == TRITON.grpc_port


def test_kubernetes_proxy_lists_every_triton_replica() -> None:
    statefulset = triton_workload()
    service_name = statefulset["spec"]["serviceName"]
    headless = kubernetes_object("Service", service_name)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == statefulset["spec"]["template"]["metadata"]["labels"]
    name = statefulset["metadata"]["name"]
    expected = [f"{name}-{i}.{service_name}:{TRITON.grpc_port}" for i in range(statefulset["spec"]["replicas"])]
    url = container_environment(pod_container(proxy_workload()))[env_name("proxy", "triton_url")]
    assert url.split(",") == expected


def test_kubernetes_gpus_match_the_tensor_parallel_size() -> None:
    container = pod_container(triton_workload())
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert int(container_environment(container)["LLGTRITON_ENGINE_TENSOR_PARALLEL_SIZE"]) == gpus


FAKE_TRITONSERVER = """#!{python}
import json, sys, threading, time
threading.Thread(target=time.sleep, args=(5,), daemon=True).start()  # as tritonserver, once its options are read
time.sleep(2)
print(json.dumps({{"argv": sys.argv[1:], "ps": open("/proc/self/cmdline").read().split(chr(0))}}))
"""


def test_the_triton_image_locks_triton_s_admin_apis_and_hides_the_keys(tmp_path: Path) -> None:
    """The image's CMD is the launcher, which runs the image's tritonserver with the restricted-API flags
    (a random admin key, the configured inference key) and hides the keys from ``ps`` and the logs."""
    assert dockerfile_stages()["triton"].command()[:3] == ["python3", "-m", "launcher.triton_server"]
    fake = tmp_path / "tritonserver"
    fake.write_text(FAKE_TRITONSERVER.format(python=sys.executable))
    fake.chmod(0o755)
    environ = {
        **os.environ,
        env_name("triton", "inference_key"): "k3y-s3cret",
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
    }
    ran = subprocess.run(
        [sys.executable, "-m", "launcher.triton_server", "--model-repository=/models"],
        env=environ, capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    seen = json.loads(ran.stdout)
    argv = seen["argv"]
    assert argv[0] == "--model-repository=/models"
    assert [flag.split("=", 1)[0] for flag in argv[1:]] == ["--grpc-restricted-protocol", "--http-restricted-api"] * 2
    assert all(flag.split("=", 1)[1].startswith("model-repository,shared-memory,trace,logging:") for flag in argv[1:3])
    assert argv[3:] == [
        "--grpc-restricted-protocol=inference:llgtriton-key=k3y-s3cret",
        "--http-restricted-api=inference:llgtriton-key=k3y-s3cret",
    ]
    admin_key = argv[1].rsplit("=", 1)[1]
    for shown in (" ".join(seen["ps"]), ran.stderr):
        assert "k3y-s3cret" not in shown and admin_key not in shown
