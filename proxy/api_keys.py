"""The API keys the proxy accepts, read once from the settings (the key itself and a key file)."""

from __future__ import annotations

from pathlib import Path

from llgtriton.settings import ProxySettings, SettingsError


def accepted_keys(settings: ProxySettings) -> list[bytes]:
    """Keys from ``api_key`` and ``api_key_file`` (one per line; blank lines and ``#`` comments skipped)."""
    keys = []
    if settings.api_key is not None:
        keys.append(settings.api_key.get_secret_value())
    if settings.api_key_file is not None:
        try:
            lines = Path(settings.api_key_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise SettingsError(f"cannot read the API key file {settings.api_key_file}: {exc.strerror}") from None
        keys.extend(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
        if not keys:
            raise SettingsError(f"the API key file {settings.api_key_file} holds no key")
    return [key.encode() for key in keys]
