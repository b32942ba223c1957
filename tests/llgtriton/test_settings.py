"""Settings: defaults < config file < environment < command line, and the backend's view of them."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from launcher import cli
from launcher.triton_server import TritonLaunchError, with_instances
from llgtriton.settings import (
    EMBEDDED_MODEL_NAME,
    SECTIONS,
    EngineSettings,
    ProxySettings,
    Settings,
    SettingsError,
    engine_environment,
    engine_settings_from,
    env_name,
    load_settings,
    parse_command_line,
    served_model_name_for,
    to_toml,
)
from tests.support.harness import ROOT

CONFIG_PBTXT = ROOT / "model_repository" / "llm" / "config.pbtxt"


def _load(argv: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> Settings:
    return load_settings(parse_command_line(list(argv)), environ or {})


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests that go through ``cli.main`` (which reads os.environ): no LLGTRITON_* leaks in."""
    for name in list(os.environ):
        if name.startswith("LLGTRITON_"):
            monkeypatch.delenv(name)


# Precedence ---------------------------------------------------------------------------------


def test_defaults_without_any_source() -> None:
    loaded = _load()
    assert loaded.proxy.port == 9000
    assert loaded.proxy.host == "127.0.0.1"
    assert loaded.triton.grpc_port == 8001
    assert loaded.engine.model == "embedded"
    assert loaded.log_level == "info"
    assert loaded.proxy.served_model_name == EMBEDDED_MODEL_NAME


def test_each_source_overrides_the_ones_before_it(tmp_path: Path) -> None:
    config = _write(
        tmp_path / "llgtriton.toml",
        """
log_level = "debug"
[proxy]
host = "0.0.0.0"
port = 1111
triton_url = "config:1"
[engine]
device = "config-device"
max_batch_size = 2
""",
    )
    environ = {
        "LLGTRITON_PROXY_PORT": "2222",
        "LLGTRITON_PROXY_TRITON_URL": "env:2",
        "LLGTRITON_LOG_LEVEL": "warning",
        "LLGTRITON_ENGINE_MAX_BATCH_SIZE": "3",
    }
    argv = ["--config", str(config), "--proxy-port", "3333", "--log-level", "error"]
    loaded = _load(argv, environ)
    assert loaded.proxy.port == 3333  # config, env and flag: the flag wins
    assert loaded.log_level == "error"  # config, env and flag: the flag wins
    assert loaded.proxy.triton_url == "env:2"  # config and env: env wins
    assert loaded.engine.max_batch_size == 3  # config and env: env wins
    assert loaded.proxy.host == "0.0.0.0"  # config only
    assert loaded.engine.device == "config-device"  # config only
    assert loaded.triton.http_port == 8000  # nobody: the default
    assert loaded.engine.model == "embedded"


@pytest.mark.parametrize(("in_config", "in_env", "in_flags"), list(itertools.product([False, True], repeat=3)))
def test_the_highest_source_that_sets_a_field_wins(
    tmp_path: Path, in_config: bool, in_env: bool, in_flags: bool
) -> None:
    argv: list[str] = []
    environ: dict[str, str] = {}
    expected = 8000
    if in_config:
        argv += ["--config", str(_write(tmp_path / "c.toml", "[triton]\nhttp_port = 1001\n"))]
        expected = 1001
    if in_env:
        environ["LLGTRITON_TRITON_HTTP_PORT"] = "1002"
        expected = 1002
    if in_flags:
        argv += ["--triton-http-port", "1003"]
        expected = 1003
    assert _load(argv, environ).triton.http_port == expected


def test_boolean_setting_from_env_and_flags() -> None:
    assert _load().triton.log_info is False
    assert _load(environ={"LLGTRITON_TRITON_LOG_INFO": "true"}).triton.log_info is True
    assert _load(["--triton-log-info"]).triton.log_info is True
    # An explicit --no-... flag beats an env var that turns it on.
    assert _load(["--no-triton-log-info"], {"LLGTRITON_TRITON_LOG_INFO": "1"}).triton.log_info is False


def test_unrelated_environment_variables_are_ignored() -> None:
    loaded = _load(environ={"PORT": "1", "LLGTRITON_UNKNOWN": "x", "PROXY_PORT": "2"})
    assert loaded == _load()


# --print-config -----------------------------------------------------------------------------


def test_printed_config_loads_back_to_the_same_settings(tmp_path: Path) -> None:
    original = _load(
        [
            "--proxy-port",
            "9100",
            "--proxy-host",
            "0.0.0.0",
            "--engine-model",
            '/models/My "quoted" \\ model.gguf',
            "--engine-max-model-len",
            "2048",
            "--engine-chat-template",
            "/templates/chat.jinja",
            "--proxy-request-timeout-s",
            "12.5",
            "--triton-log-info",
            "--log-level",
            "debug",
        ]
    )
    printed = to_toml(original)
    reloaded = _load(["--config", str(_write(tmp_path / "printed.toml", printed))])
    assert reloaded == original
    assert reloaded.proxy.served_model_name == 'My "quoted" \\ model'


def test_printed_defaults_load_back_with_unset_fields_staying_unset(tmp_path: Path) -> None:
    original = _load()
    reloaded = _load(["--config", str(_write(tmp_path / "printed.toml", to_toml(original)))])
    assert reloaded == original
    assert reloaded.engine.max_model_len is None
    assert reloaded.engine.chat_template is None


# Printable text: what a host, URL, device or path realistically holds (quotes and backslashes
# included); control characters are left out, see the report on to_toml.
printable = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")),
    max_size=20,
)
# One or more host:port replicas; the host may hold any printable text but commas and spaces.
replica_urls = st.lists(
    st.builds(
        "{}:{}".format,
        st.text(
            alphabet=st.characters(
                codec="utf-8", exclude_categories=("Cc", "Cs", "Zs", "Zl", "Zp"), exclude_characters=","
            ),
            min_size=1,
            max_size=12,
        ),
        st.integers(1, 65535),
    ),
    min_size=1,
    max_size=3,
).map(",".join)


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    host=printable,
    triton_url=replica_urls,
    model=printable,
    device=printable,
    timeout=st.floats(min_value=1e-6, max_value=1e9),
    port=st.integers(1, 65535),
)
def test_printed_config_round_trips_for_any_printable_values(
    *, tmp_path: Path, host: str, triton_url: str, model: str, device: str, timeout: float, port: int
) -> None:
    original = Settings(
        proxy=ProxySettings(host=host, triton_url=triton_url, request_timeout_s=timeout, port=port),
        engine=EngineSettings(model=model, device=device),
    ).resolved()
    path = _write(tmp_path / "printed.toml", to_toml(original))
    assert _load(["--config", str(path)]) == original


def test_cli_print_config_output_is_accepted_by_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_environ: None
) -> None:
    assert cli.main(["serve", "--print-config", "--proxy-port", "9999", "--engine-model", "/m/Llama-3"]) == 0
    printed = capsys.readouterr().out
    assert "port = 9999" in printed
    assert 'served_model_name = "Llama-3"' in printed
    path = _write(tmp_path / "printed.toml", printed)
    assert cli.main(["proxy", "--config", str(path), "--print-config"]) == 0
    assert capsys.readouterr().out == printed


# Invalid settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "environ", "field"),
    [
        (["--proxy-port", "abc"], {}, "proxy.port"),
        ([], {"LLGTRITON_PROXY_PORT": "abc"}, "proxy.port"),
        (["--proxy-port", "70000"], {}, "proxy.port"),
        (["--engine-engine", "vllm"], {}, "engine.engine"),
        ([], {"LLGTRITON_ENGINE_ENGINE": "vllm"}, "engine.engine"),
        (["--engine-dtype", "float8"], {}, "engine.dtype"),
        (["--log-level", "loud"], {}, "log_level"),
        (["--engine-max-batch-size", "0"], {}, "engine.max_batch_size"),
    ],
)
def test_invalid_value_raises_settings_error_naming_the_field(
    argv: list[str], environ: dict[str, str], field: str
) -> None:
    with pytest.raises(SettingsError, match=re.escape(field)):
        _load(argv, environ)


@pytest.mark.parametrize(
    ("location", "refusal"),
    [
        ("mysql://db/llgt", "not a mysql:// URL"),
        ("sqlite://relative.db", "not a sqlite:// URL"),
    ],
)
def test_a_store_url_that_is_neither_sqlite_nor_postgresql_is_refused_not_made_a_folder(
    location: str, refusal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingsError, match=re.escape(refusal)):
        _load(["--proxy-responses-store", location], {})
    assert list(tmp_path.iterdir()) == []


def test_a_store_is_a_path_or_a_sqlite_url() -> None:
    assert _load(["--proxy-responses-store", "sqlite:///var/lib/llgt/r.db"], {}).proxy.responses_store == Path(
        "/var/lib/llgt/r.db"
    )
    assert _load(["--proxy-responses-store", "state/r.db"], {}).proxy.responses_store == Path("state/r.db")


def test_a_store_may_be_a_postgresql_url_and_postgres_is_its_other_spelling() -> None:
    url = "postgresql://llgt@db.internal:5432/llgt"
    assert _load(["--proxy-responses-store", url], {}).proxy.responses_store == url
    assert _load([], {"LLGTRITON_PROXY_RESPONSES_STORE": "postgres://db/llgt"}).proxy.responses_store == (
        "postgresql://db/llgt"
    )


def test_unknown_key_in_config_file_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.toml", "[proxy]\nprot = 9000\n")
    with pytest.raises(SettingsError, match=r"proxy\.prot"):
        _load(["--config", str(path)])


def test_invalid_value_in_config_file_names_the_field(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.toml", '[triton]\ngrpc_port = "eight"\n')
    with pytest.raises(SettingsError, match=r"triton\.grpc_port"):
        _load(["--config", str(path)])


def test_missing_config_file_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(SettingsError, match="does not exist") as caught:
        _load(["--config", str(missing)])
    assert str(missing) in str(caught.value)


def test_config_file_that_is_not_toml_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.toml", "[proxy\nport = \n")
    with pytest.raises(SettingsError, match="not valid TOML"):
        _load(["--config", str(path)])


def test_cli_reports_invalid_settings_on_stderr_with_exit_code_2(
    capsys: pytest.CaptureFixture[str], clean_environ: None
) -> None:
    assert cli.main(["serve", "--proxy-port", "abc", "--print-config"]) == 2
    captured = capsys.readouterr()
    assert "proxy.port" in captured.err
    assert captured.out == ""


# --help -------------------------------------------------------------------------------------


def _all_fields() -> list[tuple[str | None, str]]:
    fields: list[tuple[str | None, str]] = [(None, name) for name in Settings.model_fields if name not in SECTIONS]
    for section, model in SECTIONS.items():
        fields += [(section, name) for name in model.model_fields]
    return fields


@pytest.mark.parametrize("command", ["serve", "proxy"])
def test_help_lists_every_field_with_its_flag_and_env_var(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args([command, "--help"])
    assert exited.value.code == 0
    # argparse wraps lines at whitespace; join them so that each option reads as one entry.
    text = " ".join(capsys.readouterr().out.split())
    for section, field in _all_fields():
        flag = "--" + (f"{section}-{field}" if section else field).replace("_", "-")
        entry = re.search(rf"(?:^| ){re.escape(flag)}(?: VALUE|, --no-)", text)
        assert entry is not None, f"{flag} missing from --help"
        # The first env var named after the flag's entry is this field's.
        env = re.search(r"env (LLGTRITON_\w+)\)", text[entry.end() :])
        assert env is not None, f"{flag} has no env var in --help"
        assert env.group(1) == env_name(section, field)


# Served model name --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("embedded", "SmolLM2-135M-Instruct"),
        ("/x/y/Model-7B", "Model-7B"),
        ("/x/y/Model-7B/", "Model-7B"),
        ("/a/b.gguf", "b"),
        ("relative/Qwen2.5-0.5B-Instruct", "Qwen2.5-0.5B-Instruct"),
    ],
)
def test_served_model_name_derives_from_the_engine_model(model: str, expected: str) -> None:
    assert served_model_name_for(model) == expected
    assert _load(["--engine-model", model]).proxy.served_model_name == expected


def test_explicit_served_model_name_wins_over_the_derived_one() -> None:
    loaded = _load(["--engine-model", "/a/b.gguf"], {"LLGTRITON_PROXY_SERVED_MODEL_NAME": "my-model"})
    assert loaded.proxy.served_model_name == "my-model"


# The backend's engine settings --------------------------------------------------------------


def _pbtxt_parameters() -> dict[str, str]:
    text = CONFIG_PBTXT.read_text()
    pattern = r'parameters:\s*\{\s*key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"\s*\}\s*\}'
    return dict(re.findall(pattern, text))


def test_engine_settings_from_the_shipped_config_pbtxt() -> None:
    parameters = _pbtxt_parameters()
    assert parameters  # the regex found the parameters
    assert engine_settings_from(parameters, {}) == EngineSettings(engine="torch", model="embedded", device="cpu")


def test_engine_env_overrides_config_pbtxt_parameters() -> None:
    parameters = {"engine": "torch", "model": "/models/a.gguf", "device": "cpu", "max_batch_size": "2"}
    environ = {
        "LLGTRITON_ENGINE_DEVICE": "cuda:1",
        "LLGTRITON_ENGINE_NUM_THREADS": "4",
        "LLGTRITON_PROXY_PORT": "1234",  # not an engine setting: ignored here
    }
    loaded = engine_settings_from(parameters, environ)
    assert loaded.device == "cuda:1"  # env wins
    assert loaded.num_threads == 4  # env only
    assert loaded.model == "/models/a.gguf"  # parameter only
    assert loaded.max_batch_size == 2
    assert loaded.dtype == "float32"  # default


def test_empty_and_foreign_parameters_are_ignored() -> None:
    parameters = {"model": "", "device": "cpu", "FORCE_CPU_ONLY_INPUT_TENSORS": "no", "EXECUTION_ENV_PATH": "/x"}
    assert engine_settings_from(parameters, {}) == EngineSettings(device="cpu")


def test_invalid_engine_env_raises_settings_error() -> None:
    with pytest.raises(SettingsError, match=r"max_batch_size"):
        engine_settings_from({}, {"LLGTRITON_ENGINE_MAX_BATCH_SIZE": "many"})


@pytest.mark.parametrize(
    "engine",
    [
        EngineSettings(),
        EngineSettings(
            model="/models/Qwen.gguf",
            device="cuda:1",
            dtype="bfloat16",
            chat_template=Path("/templates/chat.jinja"),
            cache_dir=Path("/var/cache/llgtriton"),
            max_batch_size=3,
            max_model_len=4096,
            num_threads=6,
        ),
    ],
)
def test_engine_environment_hands_the_settings_down_unchanged(engine: EngineSettings) -> None:
    environ = engine_environment(engine)
    assert all(name.startswith("LLGTRITON_ENGINE_") for name in environ)
    assert engine_settings_from({}, environ) == engine
    # The launcher's env wins over whatever config.pbtxt says.
    assert engine_settings_from(_pbtxt_parameters() | {"device": "tpu"}, environ) == engine


def test_engine_environment_leaves_unset_fields_out() -> None:
    environ = engine_environment(EngineSettings())
    assert "LLGTRITON_ENGINE_MAX_MODEL_LEN" not in environ
    assert "LLGTRITON_ENGINE_CHAT_TEMPLATE" not in environ
    assert environ["LLGTRITON_ENGINE_MODEL"] == "embedded"


def test_launcher_settings_reach_the_backend() -> None:
    loaded = _load(["--engine-device", "cuda", "--engine-max-model-len", "512"], {"LLGTRITON_ENGINE_DTYPE": "float16"})
    assert engine_settings_from(_pbtxt_parameters(), engine_environment(loaded.engine)) == loaded.engine


def test_triton_instances_set_the_shipped_config_pbtxt_count() -> None:
    shipped = CONFIG_PBTXT.read_text()
    assert with_instances(shipped, 1) == shipped
    three = with_instances(shipped, 3)
    assert "instance_group [ { count: 3 kind: KIND_CPU } ]" in three
    assert three.replace("count: 3", "count: 1") == shipped  # nothing else changed
    assert Settings.model_validate({"triton": {"instances": 4}}).triton.instances == 4
    with pytest.raises(ValidationError):
        Settings.model_validate({"triton": {"instances": 0}})


def test_more_instances_than_a_config_without_an_instance_group_can_take_is_refused() -> None:
    config = 'name: "llm"\nbackend: "python"\n'
    assert with_instances(config, 1) == config
    with pytest.raises(TritonLaunchError, match="no instance_group count"):
        with_instances(config, 2)
