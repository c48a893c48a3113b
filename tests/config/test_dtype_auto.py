"""`dtype: auto` of a run: resolved once (engines/precision.py's probe at the policy model's
layer sizes, figures injected here), written into config.yaml, kept on resume, printed at
the start, and shown by `hybridflow monitor`."""

import dataclasses
import json

import pytest
import yaml

from hybridflow.config.dtypes import auto_note, auto_sections, dtype_summary, keep_dtypes, probe_shape
from hybridflow.config.schema import load_run_config, resolve_run_config
from hybridflow.engines import precision
from hybridflow.engines.precision import MatmulRates, ProbeShape, measured_rates


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "_MEMO", {})


@pytest.fixture
def model_dir(tmp_path):
    """A Hugging Face model directory as far as the probe reads it: its config.json."""
    path = tmp_path / "smol"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"hidden_size": 576, "intermediate_size": 1536}))
    return path


def measured(shape: ProbeShape, threads: int, fp32: float, bf16: float) -> None:
    """This machine's figures for (shape, threads), as if the probe had run."""
    measured_rates(shape, threads, lambda s, t: MatmulRates(fp32, bf16, t, 0.5, "2026-11-27T09:00:00"))


def config(model_dir, *overrides):
    return load_run_config(None, [f"model.path={model_dir}", "resources.world_size=2", "resources.threads_per_rank=1",
                                  *overrides])


@pytest.mark.parametrize(("fp32", "bf16", "picked"), [(226.0, 157.0, "fp32"), (20.0, 45.0, "bf16")])
def test_auto_becomes_the_faster_dtype_at_the_models_layer_sizes(model_dir, fp32, bf16, picked):
    measured(ProbeShape(576, 1536), 1, fp32, bf16)  # the shape and thread count the run probes
    cfg = config(model_dir, "critic.dtype=fp32")
    assert probe_shape(cfg) == ProbeShape(576, 1536) and "critic" not in auto_sections(cfg)
    resolved = resolve_run_config(cfg)
    assert (resolved.actor.dtype, resolved.rollout.dtype) == (picked,) * 2
    assert resolved.critic.dtype == "fp32"  # a named dtype is left as it is
    assert resolved.reward_model.dtype == "auto"  # a role the run does not build (no reward model)
    note = auto_note(resolved, auto_sections(cfg))
    assert note.startswith(f"dtype: actor {picked}, rollout {picked}, critic fp32")
    assert f"fp32 {fp32:.0f} GFLOP/s, bf16 {bf16:.0f} GFLOP/s" in note and "hidden 576" in note


def test_the_builtin_and_pretrained_models_have_probe_shapes():
    cfg = load_run_config(None, [])
    assert probe_shape(cfg) == ProbeShape(cfg.model.builtin.hidden_size, cfg.model.builtin.intermediate_size)
    assert probe_shape(load_run_config(None, ["model.pretrained=smollm2-135m-instruct"])) == ProbeShape(576, 1536)


def test_resolved_dtype_is_written_into_the_runs_config_yaml(model_dir, tmp_path):
    from hybridflow.trainer.observe.monitor import run_dtypes
    from hybridflow.trainer.run.run_dir import create_run_dir

    measured(ProbeShape(576, 1536), 1, 20.0, 45.0)
    run_dir = create_run_dir(resolve_run_config(config(model_dir, f"trainer.run_dir={tmp_path / 'run'}")))
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (saved["actor"]["dtype"], saved["rollout"]["dtype"]) == ("bf16", "bf16")
    # what `hybridflow monitor` shows above its table and in its profile report (GRPO: no critic)
    assert run_dtypes(run_dir) == "actor bf16, rollout bf16"
    assert run_dtypes(tmp_path / "nowhere") is None


def test_a_resumed_run_keeps_the_dtype_it_measured(model_dir):
    measured(ProbeShape(576, 1536), 1, 20.0, 45.0)
    saved = resolve_run_config(config(model_dir))
    precision._MEMO.clear()
    precision.probe_cache_file().unlink()
    measured(ProbeShape(576, 1536), 1, 45.0, 20.0)  # the machine now measures the other way
    resumed = resolve_run_config(keep_dtypes(config(model_dir), saved))
    assert resumed.actor.dtype == saved.actor.dtype == "bf16"
    assert resolve_run_config(config(model_dir)).actor.dtype == "fp32"  # a new run measures afresh


def test_gpu_runs_take_bf16_without_probing(model_dir, monkeypatch):
    def never(*args):
        raise AssertionError("GPU runs are not probed")

    monkeypatch.setattr(precision, "measured_rates", never)
    cfg = load_run_config(None, [f"model.path={model_dir}"])  # (a GPU run's config does not validate here)
    gpu = resolve_run_config(dataclasses.replace(cfg, resources=dataclasses.replace(cfg.resources, use_gpu=True,
                                                                                    world_size=1)))
    assert gpu.actor.dtype == gpu.rollout.dtype == "bf16"


def test_monitor_title_shows_the_runs_dtype():
    from hybridflow.cli.monitor import _table

    status = {"state": "running", "step": 3, "phase": "generate", "phase_start": 0.0, "steps_done": 2,
              "restarts": 0, "dtype": "actor fp32, rollout fp32"}
    assert "dtype: actor fp32, rollout fp32" in _table([], [], [], status, None, 1.0).title


def test_dtype_summary_lists_the_roles_present():
    assert dtype_summary({"actor": {"dtype": "bf16"}, "rollout": {"dtype": "fp32"}, "name": "x",
                          "reward_model": {"dtype": "bf16", "path": None},
                          "cost_model": {"dtype": "fp32", "path": "/m"}}) == "actor bf16, rollout fp32, cost_model fp32"


@pytest.mark.parametrize(("fp32", "bf16", "picked"), [(226.0, 157.0, "fp32"), (20.0, 45.0, "bf16")])
def test_a_reward_model_run_resolves_auto_too(model_dir, fp32, bf16, picked):
    from hybridflow.config.dtypes import resolved_rm_dtype
    from hybridflow.config.rm_schema import rm_config_from_tree

    measured(ProbeShape(576, 1536), 1, fp32, bf16)
    cfg = rm_config_from_tree({"model.path": str(model_dir), "rm.data.train_files": ["pairs.jsonl"],
                               "resources.world_size": 1})
    resolved, line = resolved_rm_dtype(cfg, threads=1)
    assert resolved.rm.engine.dtype == picked and cfg.rm.engine.dtype == "auto"  # what `hybridflow rm` saves and runs
    assert line.startswith(f"dtype: reward model {picked} (engine: auto: {picked}, measured on this CPU at hidden 576")
    fixed = dataclasses.replace(cfg.rm, engine=dataclasses.replace(cfg.rm.engine, dtype="fp32"))
    fixed, line = resolved_rm_dtype(dataclasses.replace(cfg, rm=fixed), 1)
    assert fixed.rm.engine.dtype == "fp32" and line == "dtype: reward model fp32"
