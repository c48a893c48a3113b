"""An algorithm registered outside the package, examples/custom_algorithm/ (the recipe of
docs/extending.md, "Add an algorithm"): its YAML validates as documented, and RLTrainer
trains it for two steps on real Ray workers with the tiny config in each trainer.mode
(sync, one_step_off, async: the same registered program), and `hybridflow train` runs the
documented command in async mode; the metrics show that the user's phase ran and shaped
the scores that were trained on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow import RLTrainer
from hybridflow.config import load_config
from hybridflow.config.schema import RunConfig, load_run_config
from trainer_helpers import assert_finite, rl_records

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "custom_algorithm"


def test_the_example_config_finds_its_algorithm_from_the_repository_root(monkeypatch):
    monkeypatch.chdir(REPO)  # where the documented command runs; algorithm.module is relative to it
    cfg = load_run_config("examples/custom_algorithm/grpo_brevity.yaml")
    assert cfg.algorithm.name == "grpo_brevity" and cfg.algorithm.estimator == "grpo"
    assert cfg.actor.loss.policy.loss_agg_mode == "token-mean"  # the example's preset
    assert cfg.algorithm.spec.check is not None and not cfg.use_critic


@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_the_example_config_is_accepted_by_the_asynchronous_modes(monkeypatch, mode):
    """Issue 23's first failure: async mode refused every program but its own copies."""
    monkeypatch.chdir(REPO)
    cfg = load_run_config("examples/custom_algorithm/grpo_brevity.yaml", [f"trainer.mode={mode}"])
    assert cfg.trainer.mode == mode and cfg.algorithm.spec.capabilities == ()


# The asynchronous modes: one training rank beside one rollout rank.
MODES = {"sync": (), "one_step_off": ("trainer.mode=one_step_off", "resources.world_size=1"),
         "async": ("trainer.mode=async", "resources.world_size=1", "async_rl.max_staleness=1",
                   "async_rl.chunk_prompts=2", "async_rl.steps_per_call=3")}


@pytest.mark.parametrize("mode", ["sync", pytest.param("one_step_off", marks=(pytest.mark.slow, pytest.mark.extended)),
                                  pytest.param("async", marks=(pytest.mark.slow, pytest.mark.extended))])
def test_custom_algorithm_trains_two_steps(ray_local, tiny_config, mode):
    cfg = tiny_config("algorithm.name=grpo_brevity", f"algorithm.module={EXAMPLE / 'grpo_brevity.py'}",
                      "trainer.val_before_train=false", *MODES[mode])
    with RLTrainer(cfg) as trainer:
        result = trainer.train(steps=2)
        roles = set(trainer.groups)
    assert roles == ({"actor"} if mode == "sync" else {"actor", "rollout"})
    saved = load_config(RunConfig, result.run_dir / "config.yaml")  # imports algorithm.module again
    assert saved.algorithm.name == "grpo_brevity"
    _check_brevity_records(rl_records(result.run_dir), cfg, batch_on_controller=mode == "sync")


@pytest.mark.slow  # two pools of tiny-model processes
def test_the_documented_command_runs_in_async_mode(ray_local, tmp_path, monkeypatch):
    """`hybridflow train --config examples/custom_algorithm/grpo_brevity.yaml trainer.mode=async`
    (docs/extending.md), from the repository root, shrunk to the tiny model and two steps."""
    from hybridflow.cli import main as cli_main
    from trainer_helpers import TINY
    from hybridflow.trainer.run.run_dir import read_metrics

    monkeypatch.chdir(REPO)
    tiny = [o for o in TINY if not o.startswith(("rollout.n=", "trainer.total_steps="))]
    out = tmp_path / "runs"
    assert cli_main(["train", "--config", "examples/custom_algorithm/grpo_brevity.yaml", "trainer.mode=async",
                     *tiny, f"trainer.output_dir={out}", "trainer.total_steps=2", "rollout.n=4",
                     "resources.world_size=1", "trainer.val_before_train=false"]) == 0
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["phase"] == "rl"]
    assert [r["step"] for r in records] == [1, 2]
    assert all("brevity/penalty_mean" in r and "async/policy_version" in r for r in records)


def _check_brevity_records(records: list[dict], cfg: RunConfig, batch_on_controller: bool) -> None:
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        # the asynchronous modes run the program beside the data: the controller fetches none of it
        assert (record["controller/fetched_tensor_bytes"] > 0) == batch_on_controller
        assert_finite(record)
        assert {"timing_s/brevity", "actor/pg_loss", "adv/mean"} <= set(record)
        # The penalty is 0.1 x length / rollout.response_length, and the trained scores include it.
        assert record["brevity/penalty_mean"] == pytest.approx(
            -0.1 * record["response_length/mean"] / cfg.rollout.response_length)
        assert record["score/mean"] == pytest.approx(record["brevity/task_score_mean"] + record["brevity/penalty_mean"])


@pytest.mark.slow  # two pools of tiny-model processes
def test_a_program_imported_from_a_path_only_the_controller_has_runs_in_async_mode(ray_local, tiny_config, tmp_path,
                                                                                   monkeypatch):
    """docs/extending.md: importing your module before building the RunConfig registers its
    algorithm. A module the controller imports from a path of its own (sys.path changed in a
    script or notebook) is not importable in Ray's worker processes, where the asynchronous
    modes run the program: its functions travel by value, as sync mode needs nothing of them."""
    import importlib

    code = (EXAMPLE / "grpo_brevity.py").read_text(encoding="utf-8").replace('name="grpo_brevity"',
                                                                            'name="brevity_on_my_path"')
    (tmp_path / "brevity_on_my_path.py").write_text(code, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("brevity_on_my_path")
    cfg = tiny_config("algorithm.name=brevity_on_my_path", "trainer.val_before_train=false", *MODES["async"])
    with RLTrainer(cfg) as trainer:
        records = rl_records(trainer.train(steps=1).run_dir)
    assert "brevity/penalty_mean" in records[0]
