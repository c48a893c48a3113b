"""`hybridflow sft --resume` and `hybridflow rm --resume`: a job stopped after a checkpoint
continues from it (run/lifecycle.py: job_resume_point) and logs, step for step, the losses
of an uninterrupted run; the refusals; and a reward-model restart that continues on the
nodes left (run/elastic.py: restart_config).

    .venv/bin/python -m pytest -q tests/trainer/test_job_resume.py
"""

from __future__ import annotations

import pytest
from test_rm_training import TINY as RM_TINY
from test_rm_training import _write_pairs
from trainer_helpers import TINY

from hybridflow.cli import main
from hybridflow.config import save_config
from hybridflow.config.schema import load_run_config
from hybridflow.config.rm_schema import load_rm_config, validate_rm_config
from hybridflow.trainer.jobs.rm import RewardModelPart
from hybridflow.trainer.run.checkpointing import begin_checkpoint, commit_checkpoint, find_checkpoint
from hybridflow.trainer.run.run_dir import read_metrics

SFT = [*TINY, "resources.world_size=1", "sft.batch_size=4", "sft.micro_batch_size_per_device=2", "seed=0"]
RM = [*RM_TINY, "resources.world_size=1", "rm.engine.dtype=fp32", "seed=0", "trainer.console=none"]


def losses(run_dir, phase: str) -> dict[int, float]:
    return {r["step"]: r[f"{phase}/loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == phase}


def only_run(root):
    (run_dir,) = root.iterdir()
    return run_dir


@pytest.mark.slow  # ~50 s on 2 cores: three SFT runs of one rank
def test_a_stopped_sft_run_resumes_with_the_uninterrupted_losses(ray_local, tmp_path):
    def sft(out: str, *extra: str) -> int:
        return main(["sft", *SFT, f"trainer.output_dir={tmp_path / out}", "trainer.save_freq=2", *extra])

    assert sft("reference", "sft.steps=4") == 0
    assert sft("stopped", "sft.steps=2") == 0
    run_dir = only_run(tmp_path / "stopped")
    # `--resume` without PATH: the newest run of the name under trainer.output_dir, its saved config.
    assert main(["sft", "--resume", f"trainer.output_dir={tmp_path / 'stopped'}", "sft.steps=4"]) == 0
    want = losses(only_run(tmp_path / "reference"), "sft")
    assert sorted(want) == [1, 2, 3, 4]
    assert losses(run_dir, "sft") == pytest.approx(want, rel=1e-5)
    assert find_checkpoint(run_dir).name == "global_step_4"
    # The first attempt's export is set aside, not overwritten.
    assert (run_dir / "sft_model.before-resume-step2" / "config.json").is_file()
    assert (run_dir / "sft_model" / "config.json").is_file()


@pytest.mark.slow  # ~50 s on 2 cores: three reward-model runs of one rank
@pytest.mark.extended  # the same job_resume_point as the SFT test above
def test_a_stopped_rm_run_resumes_with_the_uninterrupted_losses(ray_local, tmp_path):
    train = tmp_path / "train.jsonl"
    _write_pairs(train, 80, seed=0)

    def rm(out: str, *extra: str) -> int:
        return main(["rm", *RM, f"rm.data.train_files=[{train}]", f"trainer.output_dir={tmp_path / out}",
                     "trainer.save_freq=2", "rm.eval_freq=0", *extra])

    assert rm("reference", "rm.total_steps=4") == 0
    assert rm("stopped", "rm.total_steps=2") == 0
    run_dir = only_run(tmp_path / "stopped")
    assert main(["rm", "--resume", str(run_dir), "rm.total_steps=4"]) == 0
    want = losses(only_run(tmp_path / "reference"), "rm")
    assert sorted(want) == [1, 2, 3, 4]
    assert losses(run_dir, "rm") == pytest.approx(want, rel=1e-5)
    # The held-out evaluations: the run's own at step 0 (not done again on resume), at its first end, at the end.
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "rm_eval"] == [0, 2, 4]
    assert (run_dir / "reward_model.before-resume-step2" / "config.json").is_file()  # set aside, not overwritten
    assert (run_dir / "held_out_scores.before-resume-step2.jsonl").is_file()


# ----------------------------------------------------------------------------- without workers


def stopped_run(root, kind: str | None):
    """A run directory with its config.yaml and a committed checkpoint of step 2 written by
    a run of `kind` (trainer_state.json's "kind": "rm", None for an RL run's)."""
    if kind == "rm":
        cfg = load_rm_config(None, [*RM, "rm.data.train_files=[pairs.jsonl]", f"trainer.output_dir={root}"])
    else:
        cfg = load_run_config(None, [*SFT, f"trainer.output_dir={root}"])
    run_dir = root / f"{cfg.name}-20260101-120000"
    run_dir.mkdir(parents=True)
    save_config(cfg, run_dir / "config.yaml")
    commit_checkpoint(begin_checkpoint(run_dir, 2), {"global_step": 2, "kind": kind}, None)
    return run_dir


@pytest.mark.parametrize("argv, ran, message", [
    (["sft", "--resume"], None, "found no checkpoint"),
    (["rm", "--resume"], None, "found no checkpoint"),
    (["rm", "--resume", "RUN", "rm.engine.optim.lr=1"], "rm", "rm.engine.optim.lr: saved 0.001, now 1"),
    (["sft", "--resume", "RUN", "sft.steps=4"], "rl", "is a checkpoint of a 'language-model RL' run, not of a 'sft'"),
    (["train", "--resume", "RUN"], "sft", "resume it with `hybridflow sft --resume RUN_DIR`"),
])
def test_resume_refusals_are_one_line_and_exit_2(tmp_path, capsys, argv, ran, message):
    run_dir = stopped_run(tmp_path / "runs", None if ran == "rl" else ran) if ran is not None else None
    argv = [str(run_dir) if a == "RUN" else a for a in argv]
    if run_dir is None:
        argv.append(f"trainer.output_dir={tmp_path}")
    assert main(argv) == 2
    # Ray forwards the log lines of earlier tests' workers ("(WorkerHost ... pid=N) ...") when they come.
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("hybridflow")]
    assert len(ours) == 1 and message in ours[0] and "Traceback" not in err, err
    if run_dir is not None:  # nothing of the run changed
        assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints", "config.yaml"]


def test_an_rm_restart_continues_on_the_nodes_left(ray_local):
    # Two nodes of one rank each; one is lost (Ray no longer lists it): one rank on the node left.
    cfg = load_rm_config(None, [*RM, "rm.data.train_files=[pairs.jsonl]", "resources.world_size=null",
                                "resources.nodes=2", "resources.ranks_per_node=1", "resources.min_world_size=1"])
    assert validate_rm_config(cfg) == 2
    after = RewardModelPart().restart_config(cfg, lost_node="ff" * 28)
    res = after.resources
    assert (res.world_size, res.nodes, res.ranks_per_node, res.max_world_size) == (1, 1, 1, 2)
    assert validate_rm_config(after) == 1
