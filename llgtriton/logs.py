"""Logging setup shared by the launcher, the proxy and the backend."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=FORMAT, datefmt="%H:%M:%S", force=True)
