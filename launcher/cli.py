"""``llgtriton``: start Triton with the model and the OpenAI proxy (``serve``), or the proxy alone.

    llgtriton serve                    # tritonserver (8000/8001/8002) + OpenAI API on 127.0.0.1:9000
    llgtriton proxy --proxy-triton-url host:8001
    llgtriton proxy --proxy-triton-url a:8001,b:8001   # several Triton replicas, least in-flight first
    llgtriton triton                   # only tritonserver with the model (a replica behind a proxy elsewhere)
    llgtriton serve --print-config     # the effective configuration, as TOML
    llgtriton prepare SOURCE OUTPUT    # a Hugging Face model made ready for the TensorRT-LLM engine

Run ``llgtriton serve --help`` for every option with its environment variable.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence

from launcher.formats import auto_parsers
from launcher.prepare import add_prepare_arguments, prepare_main
from launcher.triton_server import TritonLaunchError, TritonProcess
from llgtriton.logs import configure_logging
from llgtriton.settings import Settings, SettingsError, add_settings_arguments, load_settings, to_toml
from proxy.api_keys import accepted_keys
from proxy.errors import StoreUnavailableError
from proxy.responses.store_location import check_response_store

logger = logging.getLogger("llgtriton")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llgtriton", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, summary in (
        ("serve", "start tritonserver with the model repository, then the OpenAI proxy"),
        ("proxy", "start only the OpenAI proxy, in front of one or more running Tritons"),
        ("triton", "start only tritonserver with the model repository, restarted when it fails"),
    ):
        add_settings_arguments(commands.add_parser(name, help=summary, description=summary))
    summary = "make a Hugging Face model ready for the TensorRT-LLM engine (checkpoint or built engine)"
    add_prepare_arguments(commands.add_parser("prepare", help=summary, description=summary))
    return parser


async def _run_proxy(settings: Settings, triton: TritonProcess | None) -> int:
    """Serve the OpenAI API until stopped; 1 when it stopped because Triton (or the proxy's workers)
    failed for good.

    Beside a Triton this process supervises, the proxy runs in worker processes: a proxy that dies
    is replaced, and it cannot take the supervisor (and with it Triton's restarts) down.
    """
    if settings.proxy.workers > 1 or triton is not None:
        return await _run_proxy_workers(settings, triton)
    from proxy.workers import uvicorn_server

    await uvicorn_server(settings).serve()
    return 0


async def _run_proxy_workers(settings: Settings, triton: TritonProcess | None) -> int:
    """``--proxy-workers N``: supervise N proxy processes (and Triton) until SIGINT/SIGTERM."""
    from proxy.workers import ProxyWorkers

    workers = ProxyWorkers(settings)
    try:
        workers.start()
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", settings.proxy.host, settings.proxy.port, exc)
        workers.stop(0)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    failed = False

    async def watch_triton() -> None:
        nonlocal failed
        if triton is not None:
            await supervise(triton, settings.triton.max_restarts, stop.is_set)
            failed = not stop.is_set()
            stop.set()

    async def watch_workers() -> None:
        nonlocal failed
        while not stop.is_set():
            await asyncio.sleep(0.5)
            if not stop.is_set() and not workers.replace_dead():
                failed = True
                stop.set()

    watchers = [asyncio.create_task(watch_triton()), asyncio.create_task(watch_workers())]
    try:
        await stop.wait()
    finally:
        for watcher in watchers:
            watcher.cancel()
        logger.info("stopping the proxy workers (up to %d s for requests in flight)", settings.proxy.drain_timeout_s)
        await asyncio.to_thread(workers.stop, settings.proxy.drain_timeout_s + 5)
    return 1 if failed else 0


# Serving this long after a restart makes the next failure count as the first of a new run.
STABLE_S = 60.0


async def supervise(triton: TritonProcess, max_restarts: int, stopping: Callable[[], bool]) -> None:
    """Watch tritonserver and its stubs; restart it when it fails, up to ``max_restarts`` times in a row
    (failures more than :data:`STABLE_S` apart are not in a row).

    Returns when ``stopping()`` is true or when it gives up. While Triton restarts the proxy keeps
    answering: ``/ready`` and generation requests get 503 until the model is back, and the requests
    that were in flight end with an error when the old server goes.
    """
    stubs, restarts, back_at = triton.stub_pids(), 0, time.monotonic()
    while not stopping():
        await asyncio.sleep(1)
        failure = triton.failure(stubs)
        if failure is None:
            continue
        if time.monotonic() - back_at >= STABLE_S:
            restarts = 0  # it served a while since the last restart: count this failure afresh
        if restarts >= max_restarts:
            logger.error("%s; restarted %d times already, stopping", failure, restarts)
            return
        restarts += 1
        logger.error("%s; restarting tritonserver (%d of at most %d)", failure, restarts, max_restarts)
        try:
            await asyncio.to_thread(triton.restart)
        except TritonLaunchError as exc:
            logger.error("restarting tritonserver failed: %s", exc)
            return
        logger.info("Triton is back")
        stubs, back_at = triton.stub_pids(), time.monotonic()


def _start_triton(triton: TritonProcess, settings: Settings) -> None:
    triton.start()
    logger.info("loading the model into Triton (a first start converts it; later starts are fast)")
    triton.wait_ready(progress=lambda waited: logger.info("still loading the model (%.0f s)", waited))
    logger.info(
        "Triton ready: HTTP %d, gRPC %d, metrics %d",
        settings.triton.http_port,
        settings.triton.grpc_port,
        settings.triton.metrics_port,
    )


async def _supervise_until_signalled(triton: TritonProcess, max_restarts: int) -> int:
    """``llgtriton triton``: keep the server up until SIGINT/SIGTERM (0), or until it fails for good (1)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await supervise(triton, max_restarts, stop.is_set)
    return 0 if stop.is_set() else 1


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def serve(settings: Settings, *, with_proxy: bool = True) -> int:
    # uvicorn handles SIGTERM (docker stop, Kubernetes) and then re-raises it; with the default
    # handler that would kill this process before `finally` stops tritonserver and its stub.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # Ctrl-C stops the server at any moment, also when it was started as a background job, which
    # inherits SIGINT ignored (a SIGINT before the event loop took it over was lost).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    triton = TritonProcess(settings)
    try:
        _start_triton(triton, settings)
        if not with_proxy:
            return asyncio.run(_supervise_until_signalled(triton, settings.triton.max_restarts))
        logger.info(
            "OpenAI API on http://%s:%d/v1 (model %r)",
            settings.proxy.host,
            settings.proxy.port,
            settings.proxy.served_model_name,
        )
        return asyncio.run(_run_proxy(settings, triton))
    except TritonLaunchError as exc:
        logger.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        logger.info("stopping tritonserver")
        triton.stop()


def main(argv: Sequence[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    if arguments.command == "prepare":
        return prepare_main(arguments)
    try:
        settings = load_settings(arguments, os.environ)
        accepted_keys(settings.proxy)  # a bad key file stops us now, not after the model has loaded
    except SettingsError as exc:
        sys.stderr.write(f"llgtriton: {exc}\n")
        return 2
    if arguments.print_config:
        sys.stdout.write(to_toml(settings) + "".join(f"{line}\n" for line in auto_parsers(settings.engine)))
        return 0
    configure_logging(settings.log_level)
    if arguments.command in {"serve", "proxy"}:
        try:
            check_response_store(settings.proxy.responses_store)  # before the model loads
        except StoreUnavailableError as exc:
            sys.stderr.write(f"llgtriton: {exc.message}\n")
            return 2
    if arguments.command in {"serve", "triton"}:
        return serve(settings, with_proxy=arguments.command == "serve")
    try:
        return asyncio.run(_run_proxy(settings, None))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
