"""Server flags reach the configuration they name, and bad values are refused at start."""

from __future__ import annotations

import pytest

from reference_server.cli import parse_args
from reference_server.engine.fake import FakeEngineConfig
from reference_server.scheduler.engine_factory import create_engine


def test_window_defaults_and_grace_reach_the_config() -> None:
    config = parse_args(
        ["--engine", "fake", "--context-length", "1024", "--abort-grace", "1.5", "--default-max-tokens", "64"]
    )
    assert config.engine.context_length == 1024
    assert config.limits.abort_grace_s == 1.5
    assert config.limits.default_max_tokens == 64
    assert parse_args(["--engine", "fake"]).engine.context_length is None


def test_the_fake_engine_serves_the_window_asked_for() -> None:
    engine = create_engine(parse_args(["--engine", "fake", "--context-length", "1024"]).engine)
    assert engine.info().max_context_tokens == 1024
    assert FakeEngineConfig.__dataclass_fields__["max_context_tokens"].default != 1024


@pytest.mark.parametrize(
    "flags", [["--context-length", "1"], ["--abort-grace", "-1"], ["--default-max-tokens", "0"]]
)
def test_bad_values_are_refused(flags: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--engine", "fake", *flags])


def test_the_kv_cache_format_reaches_the_engine_config() -> None:
    assert parse_args(["--kv-cache", "int8"]).engine.kv_cache == "int8"
    assert parse_args([]).engine.kv_cache == "dense"
    with pytest.raises(SystemExit):
        parse_args(["--kv-cache", "fp8"])


def test_cuda_graphs_are_on_unless_turned_off() -> None:
    assert parse_args([]).engine.cuda_graphs is True
    assert parse_args(["--no-cuda-graphs"]).engine.cuda_graphs is False


@pytest.mark.parametrize(
    ("flags", "scheduler_port", "vllm_engine"),
    [
        (["--sglang-scheduler-port", "7001", "--no-vllm-engine"], 7001, False),
        (["--sglang-port", "7001", "--no-vllm-dialect"], 7001, False),  # the old names
        ([], None, True),
    ],
)
def test_each_protocol_flag_takes_its_harness_id_and_old_names_still_work(
    flags: list[str], scheduler_port: int | None, vllm_engine: bool
) -> None:
    config = parse_args(flags)
    assert config.sglang_scheduler_port == scheduler_port
    assert config.vllm_engine is vllm_engine
