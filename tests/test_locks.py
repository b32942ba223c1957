"""The locks in ``requirements/`` pin what `make install` and the Docker images install.

A fresh machine must get exactly the packages CI tested: every lock entry is pinned with hashes,
the images' smaller locks agree with the main one, the main lock lies within pyproject.toml's
ranges, and this environment holds what the lock says.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
LOCK = REQUIREMENTS / "lock.txt"
IMAGE_LOCKS = [REQUIREMENTS / "proxy.txt", REQUIREMENTS / "serve.txt"]
NO_DEPS_LOCK = REQUIREMENTS / "no-deps.txt"
CLIENTS_LOCK = REQUIREMENTS / "clients.txt"  # the client suite's own venv (.venv-clients)

_ENTRY = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)((?:\s*\\\s*--hash=sha256:[0-9a-f]{64})*)", re.MULTILINE)


@dataclass(frozen=True)
class Pin:
    version: str
    hashes: frozenset[str]


def read_lock(path: Path) -> dict[str, Pin]:
    text = path.read_text()
    pins: dict[str, Pin] = {
        canonicalize_name(match[1]): Pin(match[2], frozenset(re.findall(r"sha256:([0-9a-f]{64})", match[3])))
        for match in _ENTRY.finditer(text)
    }
    requirement_lines = [line for line in text.splitlines() if line and not line[0].isspace() and line[0] != "#"]
    assert len(pins) == len(requirement_lines), f"{path.name}: every requirement line is a '==' pin"
    return pins


@pytest.mark.parametrize("path", [LOCK, NO_DEPS_LOCK, CLIENTS_LOCK, *IMAGE_LOCKS], ids=lambda path: path.name)
def test_every_entry_is_pinned_with_hashes(path: Path) -> None:
    pins = read_lock(path)
    assert pins
    assert not [name for name, pin in pins.items() if not pin.hashes]


def test_torch_stays_out_of_the_hashed_locks() -> None:
    # torch comes by name from requirements/torch.txt: the CPU build here, the registry's elsewhere.
    for path in [LOCK, *IMAGE_LOCKS]:
        assert "torch" not in read_lock(path)
    assert Requirement((REQUIREMENTS / "torch.txt").read_text().strip()).name == "torch"


@pytest.mark.parametrize("path", IMAGE_LOCKS, ids=lambda path: path.name)
def test_image_locks_pin_what_the_main_lock_pins(path: Path) -> None:
    main = read_lock(LOCK)
    image = read_lock(path)
    assert {name: pin.version for name, pin in image.items()} == {name: main[name].version for name in image}


@pytest.mark.parametrize(("path", "extras"), [(LOCK, ["proxy", "backend", "dev"]), (CLIENTS_LOCK, ["clients"])])
def test_lock_lies_within_the_declared_ranges(path: Path, extras: list[str]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [requirement for extra in extras for requirement in project["optional-dependencies"][extra]]
    if path == LOCK:
        declared += project["dependencies"]
    pins = read_lock(path)
    outside = []
    for line in declared:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if name in pins and not requirement.specifier.contains(pins[name].version, prereleases=True):
            outside.append(f"{name}=={pins[name].version} not in {requirement.specifier}")
    assert not outside


def test_this_environment_holds_the_lock() -> None:
    """`make install` installed exactly the lock (`make test-latest` deselects this)."""
    pins: dict[str, Pin] = {**read_lock(LOCK), **read_lock(NO_DEPS_LOCK)}
    differ = {}
    for name, pin in pins.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = "missing"
        if installed != pin.version:
            differ[name] = f"{installed} installed, {pin.version} locked"
    assert not differ
