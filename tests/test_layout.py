"""The tree's import rules (docs/architecture.md), read from every module's imports, lazy ones included.

- ``llgtriton/`` is the ground both sides share: it imports neither side, nor the launcher, nor torch.
- ``proxy/`` never imports ``backend/``, the launcher or torch.
- ``backend/`` never imports the proxy, the launcher or Starlette.
- Only ``model_repository/llm/1/model.py`` imports ``triton_python_backend_utils``.
- A stub whose engine runs in a process of its own loads neither torch nor a tokenizer.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ADAPTER = ROOT / "model_repository" / "llm" / "1" / "model.py"
FORBIDDEN: dict[str, frozenset[str]] = {
    "llgtriton": frozenset({"proxy", "backend", "launcher", "torch", "transformers", "starlette", "uvicorn"}),
    "proxy": frozenset({"backend", "launcher", "torch", "transformers"}),
    "backend": frozenset({"proxy", "launcher", "starlette", "uvicorn"}),
}


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (``from a import b`` gives ``a`` and ``a.b``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def python_files(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_only_what_its_layer_may(package: str) -> None:
    broken = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in python_files(package)
        for module in sorted(imported_modules(path))
        if module.split(".")[0] in FORBIDDEN[package]
    ]
    assert not broken


def test_only_the_adapter_imports_tritons_python_backend_utils() -> None:
    everything = python_files("llgtriton", "proxy", "backend", "launcher", "model_repository", "bench")
    importers = [path for path in everything if "triton_python_backend_utils" in imported_modules(path)]
    assert importers == [ADAPTER]


def test_a_stub_whose_engine_runs_apart_loads_neither_torch_nor_a_tokenizer() -> None:
    """What model.py imports, and a service started with the engine in a core process of its own."""
    stub_modules = sorted(
        module
        for module in imported_modules(ADAPTER)
        if module.split(".")[0] in {"backend", "llgtriton"} and module.count(".") == 1
    )
    code = "\n".join(
        [
            "import json, sys",
            *(f"import {module}" for module in stub_modules),
            "from backend.entry import start_service",
            "from llgtriton.settings import EngineSettings",
            "service = start_service(EngineSettings(engine='synthetic', core_process='on'))",
            "service.health()",
            "service.shutdown()",
            "heavy = ('torch', 'transformers', 'tokenizers', 'llguidance', 'jinja2')",
            "print(json.dumps(sorted(name for name in heavy if name in sys.modules)))",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []


def test_no_module_imports_anothers_private_names() -> None:
    """A leading underscore means "this module's own": other packages' code does not reach for it."""
    reached = []
    for path in python_files("llgtriton", "proxy", "backend", "launcher", "tests"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                reached += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names if a.name[0] == "_"]
    assert not reached


def test_the_rules_see_the_modules() -> None:
    """The walk finds what it checks (a rule over no files would always pass)."""
    assert "llgtriton.wire" in imported_modules(ROOT / "proxy" / "triton_client.py")
    assert "triton_python_backend_utils" in imported_modules(ADAPTER)
    assert len(python_files("proxy")) > 10 and len(python_files("backend")) > 10
