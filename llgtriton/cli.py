"""``llgtriton``: start Triton with the model and the OpenAI proxy (``serve``), or the proxy alone.

    llgtriton serve                    # tritonserver (8000/8001/8002) + OpenAI API on 127.0.0.1:9000
    llgtriton proxy --proxy-triton-url host:8001
    llgtriton serve --print-config     # the effective configuration, as TOML

Run ``llgtriton serve --help`` for every option with its environment variable.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from llgtriton.api_keys import accepted_keys
from llgtriton.logs import configure_logging
from llgtriton.settings import Settings, SettingsError, add_settings_arguments, load_settings, to_toml
from llgtriton.triton_server import TritonLaunchError, TritonProcess

logger = logging.getLogger("llgtriton")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llgtriton", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, summary in (
        ("serve", "start tritonserver with the model repository, then the OpenAI proxy"),
        ("proxy", "start only the OpenAI proxy, in front of a running Triton"),
    ):
        add_settings_arguments(commands.add_parser(name, help=summary, description=summary))
    return parser


async def _run_proxy(settings: Settings, triton: TritonProcess | None) -> None:
    # Imported late: `--help` and `--print-config` stay fast and need no proxy dependencies.
    import uvicorn

    from proxy.app import create_app

    config = uvicorn.Config(
        create_app(settings.proxy),
        host=settings.proxy.host,
        port=settings.proxy.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)

    async def watch_triton() -> None:
        while triton is not None and not server.should_exit:
            code = triton.exit_code()
            if code is not None:
                logger.error("tritonserver exited with code %s; stopping", code)
                server.should_exit = True
            await asyncio.sleep(1)

    watcher = asyncio.create_task(watch_triton())
    try:
        await server.serve()
    finally:
        watcher.cancel()


def serve(settings: Settings) -> int:
    triton = TritonProcess(settings)
    try:
        triton.start()
        logger.info("loading the model into Triton (a first start converts it; later starts are fast)")
        triton.wait_ready(progress=lambda waited: logger.info("still loading the model (%.0f s)", waited))
        logger.info(
            "Triton ready: HTTP %d, gRPC %d, metrics %d",
            settings.triton.http_port,
            settings.triton.grpc_port,
            settings.triton.metrics_port,
        )
        logger.info(
            "OpenAI API on http://%s:%d/v1 (model %r)",
            settings.proxy.host,
            settings.proxy.port,
            settings.proxy.served_model_name,
        )
        asyncio.run(_run_proxy(settings, triton))
        return 0 if triton.exit_code() is None else 1
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
    try:
        settings = load_settings(arguments, os.environ)
        accepted_keys(settings.proxy)  # a bad key file stops us now, not after the model has loaded
    except SettingsError as exc:
        sys.stderr.write(f"llgtriton: {exc}\n")
        return 2
    if arguments.print_config:
        sys.stdout.write(to_toml(settings))
        return 0
    configure_logging(settings.log_level)
    if arguments.command == "serve":
        return serve(settings)
    try:
        asyncio.run(_run_proxy(settings, None))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
