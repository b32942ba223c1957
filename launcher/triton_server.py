"""Runs a real ``tritonserver``: the binary and python backend stubs shipped in ``nvidia-pytriton``.

The launcher lays out a runtime directory under the cache dir: a python backend directory
with the stub built for the running interpreter, and a copy of the model repository whose
``config.pbtxt`` points the stub at this virtual environment (``EXECUTION_ENV_PATH``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher import hidden_arguments
from llgtriton.logs import configure_logging
from llgtriton.settings import (
    Settings,
    TritonSettings,
    engine_environment,
    env_name,
    load_settings,
    parse_command_line,
)
from llgtriton.wire import ADMIN_KEY_HEADER, INFERENCE_KEY_HEADER

logger = logging.getLogger(__name__)


class TritonLaunchError(RuntimeError):
    """tritonserver could not be found, started, or did not become ready."""


@dataclass(frozen=True)
class TritonInstallation:
    binary: Path
    library_dir: Path
    python_backend: Path
    stub: Path

    @classmethod
    def find(cls) -> TritonInstallation:
        spec = importlib.util.find_spec("pytriton")
        if spec is None or not spec.submodule_search_locations:
            raise TritonLaunchError(
                "tritonserver comes from the nvidia-pytriton wheel: pip install --no-deps nvidia-pytriton==0.7.0"
            )
        root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        installation = cls(
            binary=root / "bin" / "tritonserver",
            library_dir=root.parent.parent / "nvidia_pytriton.libs",
            python_backend=root / "backends" / "python",
            stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
        )
        for path in (installation.binary, installation.library_dir, installation.python_backend):
            if not path.exists():
                raise TritonLaunchError(f"{path} is missing from the nvidia-pytriton installation")
        if not installation.stub.exists():
            raise TritonLaunchError(f"nvidia-pytriton has no python backend stub for Python {version}")
        return installation


def python_library_dir() -> Path:
    """Where this interpreter's ``libpython3.X.so.1.0`` lives; the stub links it by name."""
    library_dir = Path(str(sysconfig.get_config_var("LIBDIR")))
    name = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0"
    if not (library_dir / name).exists():
        raise TritonLaunchError(
            f"{name} not found in {library_dir}: the python backend stub needs a Python built with "
            "--enable-shared (pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared)"
        )
    return library_dir


@dataclass(frozen=True)
class RuntimeLayout:
    backend_dir: Path
    model_repository: Path


_INSTANCE_COUNT = re.compile(r"(instance_group\s*\[\s*\{[^}]*?\bcount\s*:\s*)\d+")


def with_instances(config: str, instances: int) -> str:
    """``config`` (a config.pbtxt) with its first instance group's count set to ``instances``."""
    updated, found = _INSTANCE_COUNT.subn(lambda match: f"{match.group(1)}{instances}", config, count=1)
    if found:
        return updated
    if instances == 1:
        return config  # Triton's default: one instance
    raise TritonLaunchError(f"the model's config.pbtxt has no instance_group count to set to {instances}")


def runtime_dir(settings: Settings) -> Path:
    # One runtime directory per gRPC port, so several servers on one machine do not collide.
    return settings.engine.cache_dir / "triton-runtime" / str(settings.triton.grpc_port)


def prepare_runtime(settings: Settings, installation: TritonInstallation) -> RuntimeLayout:
    runtime = runtime_dir(settings)
    backend = runtime / "backends" / "python"
    if backend.exists():
        shutil.rmtree(backend)
    backend.mkdir(parents=True)
    for item in installation.python_backend.iterdir():
        if item.is_file():
            (backend / item.name).symlink_to(item)
    shutil.copy2(installation.stub, backend / installation.stub.name)

    repository = runtime / "model_repository"
    if repository.exists():
        shutil.rmtree(repository)
    source = settings.triton.model_repository
    if not source.is_dir():
        raise TritonLaunchError(f"model repository {source} does not exist")
    shutil.copytree(source, repository, ignore=shutil.ignore_patterns("__pycache__"))
    config = repository / settings.proxy.model_name / "config.pbtxt"
    if not config.exists():
        raise TritonLaunchError(f"{source} has no model named {settings.proxy.model_name!r}")
    config.write_text(with_instances(config.read_text(encoding="utf-8"), settings.triton.instances), encoding="utf-8")
    with config.open("a", encoding="utf-8") as handle:
        handle.write(
            "\n# Added by the llgtriton launcher: run the stub in this virtual environment.\n"
            f'parameters: {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{sys.prefix}" }} }}\n'
        )
    return RuntimeLayout(backend_dir=runtime / "backends", model_repository=repository)


def command(settings: Settings, installation: TritonInstallation, layout: RuntimeLayout) -> list[str]:
    triton = settings.triton
    cpu_only = not settings.engine.device.startswith("cuda")
    gpu_flags = ["--pinned-memory-pool-byte-size=0", "--allow-gpu-metrics=false"] if cpu_only else []
    return [
        str(installation.binary),
        f"--model-repository={layout.model_repository}",
        f"--backend-directory={layout.backend_dir}",
        f"--http-address={triton.address}",
        f"--http-port={triton.http_port}",
        f"--grpc-address={triton.address}",
        f"--grpc-port={triton.grpc_port}",
        f"--metrics-address={triton.address}",
        f"--metrics-port={triton.metrics_port}",
        f"--log-info={'true' if triton.log_info else 'false'}",
        "--exit-timeout-secs=10",
        *restricted_api_flags(triton),
        *gpu_flags,
    ]


# Triton's API groups that change the server or read its internals, as its restricted-API flags name them.
ADMIN_APIS = "model-repository,shared-memory,trace,logging"


def restricted_api_flags(triton: TritonSettings) -> list[str]:
    """tritonserver flags that put the admin APIs, and the inference API when keyed, behind a header."""
    admin = triton.admin_key.get_secret_value() if triton.admin_key else secrets.token_urlsafe(32)
    groups = [f"{ADMIN_APIS}:{ADMIN_KEY_HEADER}={admin}"]
    if triton.inference_key is not None:
        groups.append(f"inference:{INFERENCE_KEY_HEADER}={triton.inference_key.get_secret_value()}")
    return [f"--{kind}={group}" for group in groups for kind in ("grpc-restricted-protocol", "http-restricted-api")]


def keys_in(argv: Sequence[str]) -> list[str]:
    """The keys of the restricted-API flags in ``argv`` (``--...=<apis>:<header>=<key>``)."""
    flags = ("--grpc-restricted-protocol=", "--http-restricted-api=")
    return [argument.split("=", 2)[2] for argument in argv if argument.startswith(flags) and argument.count("=") >= 2]


def start_hiding_keys(process: subprocess.Popen[bytes], argv: Sequence[str]) -> None:
    """Overwrite the keys in ``process``'s arguments once it has read them (:mod:`launcher.hidden_arguments`)."""

    def hide_them() -> None:
        if not hidden_arguments.hide(process.pid, keys_in(argv)) and process.poll() is None:
            logger.warning("could not hide Triton's keys from the process list (ps): this system forbids it")

    threading.Thread(target=hide_them, name="llgtriton-hide-keys", daemon=True).start()


def environment(settings: Settings, installation: TritonInstallation, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    paths = [str(installation.library_dir), str(python_library_dir())]
    if base.get("LD_LIBRARY_PATH"):
        paths.append(base["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(paths)
    env.update(engine_environment(settings.engine))
    env[env_name(None, "log_level")] = settings.log_level
    return env


STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class _Process:
    pid: int
    parent: int
    running: bool  # not a zombie
    command_line: bytes


def _processes() -> Iterator[_Process]:
    """Every process in ``/proc``, as far as it could be read (one that exits while we look is skipped)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command_line = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        yield _Process(int(entry.name), int(fields[1]), fields[0] != "Z", command_line)


def live_children(parent: int, name: str) -> list[int]:
    """Pids of the running (not zombie) children of ``parent`` whose command line contains ``name``."""
    return [p.pid for p in _processes() if p.running and p.parent == parent and name.encode() in p.command_line]


def reap_orphans(runtime: Path) -> list[int]:
    """SIGKILL what an earlier launcher of this runtime directory left behind; the pids killed.

    A launcher killed outright leaves its tritonserver holding the ports (no new server can start),
    and a stub whose tritonserver died keeps running, holding the model's memory, and ignores
    SIGTERM. A process of this runtime is an orphan when its parent is neither an llgtriton
    launcher nor a tritonserver.
    """
    marker = f"{runtime}/".encode()  # not a prefix of another port's directory
    processes = list(_processes())
    command_lines = {p.pid: p.command_line for p in processes}
    ours = [p for p in processes if marker in p.command_line and p.pid != os.getpid()]
    orphans: set[int] = set()
    grew = True
    while grew:  # a stub of an orphaned tritonserver is an orphan too
        grew = False
        for process in ours:
            parent = command_lines.get(process.parent, b"")
            kept = process.parent not in orphans and (b"llgtriton" in parent or b"tritonserver" in parent)
            if not kept and process.pid not in orphans:
                orphans.add(process.pid)
                grew = True
    killed = []
    for pid in sorted(orphans):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    if killed:
        logger.warning("killed %d processes an earlier server left behind: pids %s", len(killed), killed)
    return killed


def _kill_group(leader: int) -> None:
    """SIGKILL the process group that tritonserver leads: the server, and stubs that outlived it.

    A stub whose tritonserver was killed keeps running (holding its memory, a GPU's included), and
    it stays in the server's group after the server has exited.
    """
    with contextlib.suppress(ProcessLookupError):  # nothing of it left
        os.killpg(leader, signal.SIGKILL)


class TritonProcess:
    """A tritonserver child process with readiness polling and clean shutdown."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def http_url(self) -> str:
        host = self._settings.triton.address
        host = "127.0.0.1" if host in {"0.0.0.0", ""} else host
        return f"http://{host}:{self._settings.triton.http_port}"

    def start(self) -> None:
        installation = TritonInstallation.find()
        reap_orphans(runtime_dir(self._settings))
        layout = prepare_runtime(self._settings, installation)
        argv = command(self._settings, installation, layout)
        logger.info("starting %s", " ".join(hidden_arguments.redacted(argv, keys_in(argv))))
        self._process = subprocess.Popen(
            argv, env=environment(self._settings, installation, os.environ), start_new_session=True
        )
        start_hiding_keys(self._process, argv)

    def exit_code(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def _model_ready(self) -> bool:
        url = f"{self.http_url}/v2/models/{self._settings.proxy.model_name}/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, progress: Callable[[float], None] | None = None) -> None:
        """Block until the model is ready; ``progress`` gets the seconds waited every few seconds."""
        started = time.monotonic()
        last_report = started
        while not self._model_ready():
            code = self.exit_code()
            if code is not None:
                raise TritonLaunchError(f"tritonserver exited with code {code} before the model was ready")
            now = time.monotonic()
            if now - started > self._settings.triton.startup_timeout_s:
                raise TritonLaunchError(
                    f"the model was not ready after {self._settings.triton.startup_timeout_s:.0f} s"
                )
            if progress is not None and now - last_report >= 5:
                progress(now - started)
                last_report = now
            time.sleep(0.5)

    def stub_pids(self) -> frozenset[int]:
        """Live python backend stub processes of this tritonserver (one per model instance)."""
        if self._process is None or self._process.poll() is not None:
            return frozenset()
        return frozenset(live_children(self._process.pid, STUB_NAME))

    def failure(self, stubs: frozenset[int]) -> str | None:
        """Why this server can no longer serve (it exited, or one of ``stubs`` died), or None.

        Triton keeps reporting a model ready after its stub died and fails every request to it, so
        the stubs are watched directly.
        """
        code = self.exit_code()
        if code is not None:
            return f"tritonserver exited with code {code}"
        dead = stubs - self.stub_pids()
        if dead:
            return f"the python backend stub (pid {', '.join(map(str, sorted(dead)))}) died"
        return None

    def restart(self) -> None:
        """Kill this server at once (its model is broken: nothing to drain), start it again, wait for the model."""
        self.kill()
        self.start()
        self.wait_ready()

    def kill(self) -> None:
        if self._process is None:
            return
        _kill_group(self._process.pid)
        self._process.wait()

    def stop(self, timeout: float = 20.0) -> None:
        if self._process is None:
            return
        if self._process.poll() is not None:
            _kill_group(self._process.pid)  # it died: what it started may still run
            return
        os.killpg(self._process.pid, signal.SIGTERM)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            logger.warning("tritonserver did not stop in %.0f s; killing it", timeout)
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """``python3 -m launcher.triton_server [tritonserver arguments]``: the triton image's command.

    Runs the image's own ``tritonserver`` (not the one this launcher takes from nvidia-pytriton) with
    the given arguments and the restricted-API flags of the environment's settings, hides their keys
    from the process list, passes SIGTERM and SIGINT on, and exits as tritonserver does.
    """
    configure_logging(os.environ.get(env_name(None, "log_level"), "info"))
    settings = load_settings(parse_command_line([]), os.environ)
    command_line = ["tritonserver", *(sys.argv[1:] if argv is None else argv), *restricted_api_flags(settings.triton)]
    logger.info("starting %s", " ".join(hidden_arguments.redacted(command_line, keys_in(command_line))))
    process = subprocess.Popen(command_line)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: process.send_signal(received))
    start_hiding_keys(process, command_line)
    sys.exit(process.wait())


if __name__ == "__main__":
    main()
