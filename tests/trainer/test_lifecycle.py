"""Where a run starts from (hybridflow/trainer/run/lifecycle.py): the policy's starting model
for every kind of model source, and the resume point that `hybridflow train --resume` and
`RLTrainer(resume=...)` share.

The model.pretrained case uses a tiny pretrained entry registered for the test: a stand-in
package (a directory on sys.path with a GGUF file name and dist-info, as a wheel installs
it) whose cache entry holds the tiny built-in model with a complete manifest, so the real
`pretrained_model_dir` resolves it without converting anything.

    .venv/bin/python -m pytest -q tests/trainer/test_lifecycle.py
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from hybridflow import RLTrainer
from hybridflow.cli import main as cli_main
from hybridflow.config import ConfigError, save_config
from hybridflow.config.sections.model import BuiltinModelSection
from hybridflow.engines import pretrained
from hybridflow.trainer.run.checkpointing import STATE_VERSION, begin_checkpoint, commit_checkpoint, saved_run
from hybridflow.trainer.run.lifecycle import (
    base_model_path,
    policy_start_path,
    resume_point,
    write_builtin_model,
)
from hybridflow.trainer.run.run_dir import read_metrics
from trainer_helpers import counted_reads

TINY_PRETRAINED = "tiny-pretrained-test"
# The sizes of trainer_helpers.py's TINY model: seconds per step on 2 CPU ranks.
TINY_SIZES = BuiltinModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=2)


@pytest.fixture
def tiny_pretrained(tmp_path, monkeypatch) -> Path:
    """Register TINY_PRETRAINED (package, cache entry); returns its cache directory."""
    site = tmp_path / "site"
    package = site / "hybridflow_tiny_pretrained"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tiny.gguf").write_bytes(b"GGUF")  # never read: the cache entry is complete
    dist_info = site / "hybridflow_tiny_pretrained-0.1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: hybridflow-tiny-pretrained\nVersion: 0.1.0\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    spec = pretrained.PretrainedSpec(package="hybridflow_tiny_pretrained",
                                     distribution="hybridflow-tiny-pretrained", gguf_file="tiny.gguf")
    monkeypatch.setitem(pretrained.PRETRAINED_MODELS, TINY_PRETRAINED, spec)
    cache = tmp_path / "cache"
    monkeypatch.setenv(pretrained.CACHE_ENV, str(cache))
    entry = pretrained.entry_dir(TINY_PRETRAINED, cache)
    write_builtin_model(TINY_SIZES, entry, seed=0)
    files = {str(p.relative_to(entry)): p.stat().st_size for p in sorted(entry.rglob("*")) if p.is_file()}
    (entry / pretrained.MANIFEST).write_text(json.dumps({"format": pretrained.FORMAT_VERSION, "files": files}))
    assert pretrained.pretrained_model_dir(TINY_PRETRAINED) == entry  # complete: nothing converted
    return entry


# ----------------------------------------------------------------------------- the starting model


def test_the_starting_model_of_each_model_source(tiny_config, tiny_pretrained, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # The built-in model: written into the run when it starts, required when it is read.
    builtin = tiny_config()
    with pytest.raises(FileNotFoundError, match="starting model .*model'? is missing"):
        policy_start_path(builtin, run_dir)
    written = base_model_path(builtin, run_dir, write_builtin=True)
    assert written == str(run_dir / "model") and (run_dir / "model" / "config.json").is_file()
    assert policy_start_path(builtin, run_dir) == written
    # model.pretrained: the cache entry, whatever the run directory holds (no <run>/model).
    other_run = tmp_path / "other_run"
    other_run.mkdir()
    from_pretrained = tiny_config(f"model.pretrained={TINY_PRETRAINED}")
    assert policy_start_path(from_pretrained, other_run) == str(tiny_pretrained)
    assert base_model_path(from_pretrained, other_run, write_builtin=True) == str(tiny_pretrained)
    assert not (other_run / "model").exists()
    # model.path as given; an SFT warm start replaces any of them with <run>/sft_model.
    assert policy_start_path(tiny_config(f"model.path={tiny_pretrained}"), other_run) == str(tiny_pretrained)
    warm = tiny_config(f"model.pretrained={TINY_PRETRAINED}", "sft.steps=2")
    with pytest.raises(FileNotFoundError, match="sft_model"):
        policy_start_path(warm, other_run)
    write_builtin_model(TINY_SIZES, other_run / "sft_model", seed=1)
    assert policy_start_path(warm, other_run) == str(other_run / "sft_model")


# ~40 s on 2 cores: a 1-step run on 2 Ray ranks and an eval of its checkpoint.
@pytest.mark.slow
def test_eval_of_a_checkpoint_of_a_pretrained_run_without_sft(ray_local, tiny_config, tiny_pretrained, tmp_path):
    cfg = tiny_config(f"model.pretrained={TINY_PRETRAINED}", "trainer.total_steps=1", "trainer.save_freq=1",
                      "trainer.val_before_train=false")
    with RLTrainer(cfg) as trainer:
        run_dir = trainer.train().run_dir
    assert not (run_dir / "model").exists()  # the policy started from the cache entry
    (evaluated,) = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "eval"]
    out = tmp_path / "report.json"
    assert cli_main(["eval", str(run_dir), "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["model_path"] == str(tiny_pretrained) and report["step"] == 1
    # The checkpoint's policy scored with the run's settings: the run's own evaluation.
    assert report["metrics"] == {k: v for k, v in evaluated.items() if k.startswith("val/")}


# ----------------------------------------------------------------------------- resuming


def _run_with_checkpoint(cfg, run_dir: Path, step: int) -> Path:
    """A run directory as a run leaves it: config.yaml and a committed checkpoint of `step`
    (with the rollout pool's state in the asynchronous modes)."""
    run_dir.mkdir(parents=True)
    save_config(cfg, run_dir / "config.yaml")
    tmp = begin_checkpoint(run_dir, step)
    pool = {"async": {"version": step, "calls": step, "dropped_total": 0, "filtered_total": 0,
                      "requeued_prompts": 0}} if cfg.trainer.mode != "sync" else {}
    return commit_checkpoint(tmp, {"version": STATE_VERSION, "global_step": step, **pool}, keep_last=None)


@pytest.mark.parametrize("saved, now, fix", [
    ("sync", "async", "trainer.mode=sync"), ("sync", "one_step_off", "trainer.mode=sync"),
    ("async", "sync", "trainer.mode=one_step_off or async"),
    ("one_step_off", "sync", "trainer.mode=one_step_off or async"),
])
def test_a_checkpoint_resumes_only_in_a_mode_of_its_kind(tiny_config, tmp_path, saved, now, fix):
    """trainer.* may change on resume, but a checkpoint of the asynchronous modes holds the
    rollout pool's state (policy version, sampling calls, prompts sent and not trained) and
    a sync one has none: refused before any worker starts (it was a KeyError after both
    pools had started, or the sent prompts skipped). one_step_off and async share it."""
    checkpoint = _run_with_checkpoint(tiny_config("resources.world_size=1", f"trainer.mode={saved}"),
                                      tmp_path / "run", 2)
    with pytest.raises(ConfigError) as err:
        resume_point(checkpoint, None, [f"trainer.mode={now}"])
    assert str(err.value).startswith(f"trainer.mode: {now} cannot resume") and fix in str(err.value)
    assert "\n" not in str(err.value)
    other = {"async": "one_step_off", "one_step_off": "async"}.get(saved)
    if other is not None:
        assert resume_point(checkpoint, None, [f"trainer.mode={other}"]).cfg.trainer.mode == other


def test_resume_point_from_a_path_from_the_run_name_and_with_overrides(tiny_config, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    saved = tiny_config("name=lifecycle", "trainer.total_steps=4")
    checkpoint = _run_with_checkpoint(saved, runs / "lifecycle-20260101-120000", 3)
    reads = counted_reads(monkeypatch, checkpoint.parent.parent / "config.yaml")
    assert resume_point(checkpoint, None, ["trainer.total_steps=9"]).cfg.trainer.total_steps == 9
    assert len(reads) == 1  # the saved config and the overridden one come from one read
    run = saved_run(checkpoint)
    assert resume_point(run, None, ["trainer.total_steps=9"]).checkpoint == checkpoint and len(reads) == 2

    point = resume_point(checkpoint.parent.parent)  # a run directory: its newest checkpoint
    assert (point.checkpoint, point.step, point.cfg.trainer.total_steps) == (checkpoint, 3, 4)
    longer = resume_point(checkpoint, None, ["trainer.total_steps=9"])  # overrides on the saved config
    assert longer.cfg.trainer.total_steps == 9 and longer.cfg.name == "lifecycle"
    # True: found by name and trainer.output_dir, as `hybridflow train --resume name=...` does.
    found = resume_point(True, None, ["name=lifecycle", f"trainer.output_dir={runs}"])
    assert found.checkpoint == checkpoint and found.cfg.trainer.total_steps == 4
    assert resume_point(True, tiny_config("name=lifecycle", "trainer.total_steps=4")).checkpoint == checkpoint

    with pytest.raises(ConfigError, match="rollout.temperature: saved 1.0, now 0.5"):
        resume_point(checkpoint, None, ["rollout.temperature=0.5"])
    with pytest.raises(ValueError, match="apply them when building it"):
        resume_point(checkpoint, saved, ["trainer.total_steps=9"])
    with pytest.raises(ValueError, match="fresh run"):
        resume_point(False)


def test_the_trainer_takes_the_cli_resume_point_and_refuses_a_second_config(tiny_config, tmp_path):
    checkpoint = _run_with_checkpoint(tiny_config(), tmp_path / "run", 1)
    with pytest.raises(ValueError, match="carries its config"):
        RLTrainer(tiny_config(), resume=resume_point(checkpoint))


def test_sft_warm_start_builds_the_rl_actor_in_its_workers_and_equals_a_fresh_start(ray_local, tiny_config,
                                                                                     monkeypatch):
    # The RL actor is rebuilt in the SFT actor's processes (no second start of Ray
    # actors, imports and rendezvous); its RL steps must equal those of a run that starts
    # new workers from the same <run>/sft_model. Same computations in the same order, so
    # the tolerance is float round-off only (1e-6 relative).
    import hybridflow.trainer.jobs.sft as sft_module

    sft_pids: list[int] = []
    build = sft_module.build_groups

    def recording_build(*args, **kwargs):
        groups = build(*args, **kwargs)
        sft_pids.extend(info["pid"] for info in groups["actor"].worker_info)
        return groups

    monkeypatch.setattr(sft_module, "build_groups", recording_build)
    with RLTrainer(tiny_config("sft.steps=2", "sft.test_freq=0")) as warm:
        warm.train()
        assert [info["pid"] for info in warm.groups["actor"].worker_info] == sft_pids and len(sft_pids) == 2
    with RLTrainer(tiny_config(f"model.path={warm.run_dir / 'sft_model'}")) as fresh:
        fresh.train()
        assert not set(info["pid"] for info in fresh.groups["actor"].worker_info) & set(sft_pids)
    rl = [[r for r in read_metrics(run / "metrics.jsonl") if r["phase"] in ("rl", "eval")]
          for run in (warm.run_dir, fresh.run_dir)]
    assert [r["step"] for r in rl[0]] == [r["step"] for r in rl[1]] == [0, 1, 2, 2]
    for a, b in zip(*rl):
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean", "val/score"):
            if key in a or key in b:
                assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-7), (key, a["step"])


def test_trainer_resume_names_the_checkpoint_a_run_starts_from(tiny_config, tmp_path):
    """trainer.resume: never (a fresh run), auto (the newest checkpoint of the run directory or
    of the newest run of the config's name, or a fresh run when there is none), a path."""
    from test_resume import fake_checkpoint

    from hybridflow.trainer.run.lifecycle import configured_resume

    run = tmp_path / "runs" / "r"
    assert configured_resume(tiny_config("trainer.resume=auto", f"trainer.run_dir={run}")) is None
    fake_checkpoint(run, 1)
    newest = fake_checkpoint(run, 2)
    assert configured_resume(tiny_config("trainer.resume=auto", f"trainer.run_dir={run}")) == newest
    assert configured_resume(tiny_config(f"trainer.resume={run}")) == newest
    assert configured_resume(tiny_config(f"trainer.run_dir={run}")) is None  # never, the default
    named = tmp_path / "runs" / "arithmetic-grpo-20260101-120000"
    fake_checkpoint(named, 3)
    assert configured_resume(tiny_config("trainer.resume=auto")) == named / "checkpoints" / "global_step_3"


def test_total_epochs_counts_whole_batches_of_the_prompts_kept(tiny_config):
    from hybridflow.trainer.observe.display import RunDisplay
    from hybridflow.trainer.run.setup import with_epoch_steps

    said = []
    display = RunDisplay("none")
    display.message = said.append
    epochs = tiny_config("trainer.total_epochs=3", "trainer.total_steps=null", "data.train_batch_size=4")
    assert with_epoch_steps(epochs, 10, display).trainer.total_steps == 6  # 3 x 2 batches, 2 prompts left over
    assert said == ["trainer.total_steps=6: trainer.total_epochs=3 x 2 batches of 4 prompts (10 kept)"]
    capped = tiny_config("trainer.total_epochs=3", "trainer.total_steps=5", "data.train_batch_size=4")
    assert with_epoch_steps(capped, 10, display).trainer.total_steps == 5
    with pytest.raises(ConfigError, match="^trainer.total_epochs: 3 training prompts make no whole batch"):
        with_epoch_steps(epochs, 3, display)
