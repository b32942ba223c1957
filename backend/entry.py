"""Where ``model.py`` enters the backend: the service ``settings`` ask for, in this process or apart.

A stub whose engine runs in a process of its own (``--engine-core-process``) imports only
:mod:`backend.core_process` and what it needs, neither torch nor a tokenizer; the engine's side
(:mod:`backend.assembly`) is imported by the core, or here when the engine runs in the stub.
"""

from __future__ import annotations

from backend.contract import Service
from llgtriton.settings import EngineSettings


def uses_core_process(settings: EngineSettings) -> bool:
    if settings.core_process == "auto":
        return settings.device.startswith("cuda") and settings.engine != "synthetic"
    return settings.core_process == "on"


def start_service(settings: EngineSettings, *, shared_as: str | None = None) -> Service:
    """The service for ``settings.engine``: in this process, or in an engine process of its own,
    which the instances given the same ``shared_as`` share."""
    if uses_core_process(settings):
        from backend.core_process import CoreProcess, CoreRendezvous
        from backend.response_pump import pump_for

        rendezvous = CoreRendezvous.named(shared_as) if shared_as is not None else None
        return CoreProcess(settings, pump_for(settings), rendezvous=rendezvous)
    from backend.assembly import start_in_process  # the engine's side: torch, the tokenizer

    return start_in_process(settings)
