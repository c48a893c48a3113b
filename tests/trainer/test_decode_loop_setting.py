"""The native engine's decode-loop settings from a run config: rollout.decode_loop,
readback_every, compile_decode and cuda_graphs reach the rollout engine, a bad value is one
line keyed by its setting (CLI exit 2), the loop "auto" resolved to is printed once and
saved in config.yaml, and a resumed run may change them (a CPU run resumed on a GPU)."""

from __future__ import annotations

import pytest
import torch
import yaml

from hybridflow.cli import main
from hybridflow.config.schema import load_run_config
from hybridflow.config.validation import run_decode_loop
from hybridflow.errors import ConfigError
from hybridflow.trainer.run.lifecycle import RESUMABLE_CHANGES, unchanged_but
from hybridflow.workers.generation import rollout_engine_config


def test_the_settings_reach_the_rollout_engine():
    cfg = load_run_config(None, ["rollout.decode_loop=device", "rollout.readback_every=3",
                                 "rollout.compile_decode=true"])
    engine = rollout_engine_config(cfg.rollout, torch.device("cpu"), trust_remote_code=False)
    assert (engine.decode_loop, engine.readback_every, engine.compile_decode, engine.cuda_graphs) == (
        "device", 3, True, False)
    default = load_run_config(None, [])
    assert rollout_engine_config(default.rollout, torch.device("cpu"), trust_remote_code=False).decode_loop == "host"
    assert run_decode_loop(default) == "host"
    assert run_decode_loop(load_run_config(None, ["resources.use_gpu=true"])) == "device"


@pytest.mark.parametrize("overrides, key, fix", [
    (["rollout.decode_loop=gpu"], "rollout.decode_loop", "must be one of"),
    (["rollout.compile_decode=true"], "rollout.compile_decode", "set decode_loop to device"),
    (["rollout.decode_loop=device", "rollout.cuda_graphs=true"], "rollout.cuda_graphs", "set it to false"),
])
def test_a_bad_value_is_one_line_naming_the_setting_and_the_fix(tmp_path, capsys, overrides, key, fix):
    assert main(["train", f"trainer.output_dir={tmp_path}", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and key + ":" in err and fix in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("overrides, line, saved", [
    ([], "decode loop: host (auto: no GPU) (rollout.decode_loop)", "host"),
    (["rollout.decode_loop=device", "rollout.readback_every=3"],
     "decode loop: device, read back every 3 steps (rollout.decode_loop)", "device"),
])
def test_a_run_prints_its_decode_loop_once_and_saves_it(ray_local, tmp_path, capsys, overrides, line, saved):
    from hybridflow.trainer.run.setup import RunContext

    cfg = load_run_config(None, [f"trainer.output_dir={tmp_path}", "trainer.console=plain", "sft.steps=0",
                                 *overrides])
    ctx = RunContext.open(cfg)
    try:
        printed = capsys.readouterr().out
        assert printed.count("decode loop:") == 1 and line in printed, printed
        assert ctx.cfg.rollout.decode_loop == saved
        assert yaml.safe_load((ctx.run_dir / "config.yaml").read_text())["rollout"]["decode_loop"] == saved
    finally:
        ctx.close()


def test_a_resumed_run_may_change_the_decode_loop_but_not_the_sampling(tmp_path):
    saved = load_run_config(None, ["rollout.decode_loop=host"])
    on_gpu = load_run_config(None, ["rollout.decode_loop=device", "rollout.readback_every=4"])
    assert unchanged_but(tmp_path, saved, on_gpu, RESUMABLE_CHANGES, "fix").rollout.decode_loop == "device"
    with pytest.raises(ConfigError, match="rollout.temperature"):
        unchanged_but(tmp_path, saved, load_run_config(None, ["rollout.temperature=0.5"]), RESUMABLE_CHANGES, "fix")
