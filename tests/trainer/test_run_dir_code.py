"""Nothing a run directory holds makes `hybridflow export` or `eval` run code: a run's
config.yaml naming a reward file, an algorithm module (both planted in the run directory),
trust_remote_code or a loosened reward sandbox is read as data. export imports none of it;
eval refuses a reward file it was not told to use (naming the key and --use-run-reward),
and one named on the command line is imported only in a confined reward worker."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hybridflow.cli import main
from hybridflow.config import save_config
from hybridflow.trainer.jobs.offline import resolve_source
from hybridflow.trainer.run.lifecycle import base_model_path
from tests.checkpoints import write_run_checkpoint


def planted(run_dir: Path, name: str, marker: Path) -> Path:
    """A .py file in the run directory whose import writes `marker`."""
    path = run_dir / name
    path.write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    return path


@pytest.fixture
def foreign_run(tmp_path, tiny_config):
    """A run directory from someone else: a checkpoint, the built-in model, and a config.yaml
    that names code of the directory's own and loosens the reward sandbox."""
    run_dir = tmp_path / "run"
    write_run_checkpoint(run_dir)
    cfg = tiny_config("resources.world_size=1")
    save_config(cfg, run_dir / "config.yaml")
    base_model_path(cfg, run_dir, write_builtin=True)
    markers = {"reward": tmp_path / "reward-ran", "algorithm": tmp_path / "algorithm-ran"}
    tree = yaml.safe_load((run_dir / "config.yaml").read_text())
    tree["reward"]["custom_fn_path"] = str(planted(run_dir, "reward.py", markers["reward"]))
    tree["algorithm"]["module"] = str(planted(run_dir, "algo.py", markers["algorithm"]))
    tree["reward"]["manager"].update(sandbox=False, allow_subprocess=True, env_passthrough=["WANDB_API_KEY"])
    tree["model"]["trust_remote_code"] = True
    (run_dir / "config.yaml").write_text(yaml.safe_dump(tree))
    return run_dir, markers


def test_export_reads_the_runs_config_as_data(foreign_run, tmp_path):
    run_dir, markers = foreign_run
    source = resolve_source(run_dir, reward=False)  # what `hybridflow export RUN` does first
    cfg = source.cfg
    assert cfg.reward.custom_fn_path is None and cfg.algorithm.module is None and not cfg.model.trust_remote_code
    assert cfg.reward.manager.sandbox and not cfg.reward.manager.allow_subprocess and not cfg.reward.manager.env_passthrough
    assert set(source.not_taken) == {"reward.custom_fn_path", "algorithm.module", "model.trust_remote_code",
                                     "reward.manager.sandbox", "reward.manager.allow_subprocess",
                                     "reward.manager.env_passthrough"}
    assert not markers["reward"].exists() and not markers["algorithm"].exists()


def test_eval_refuses_a_reward_file_it_was_not_told_to_use(foreign_run, capsys):
    run_dir, markers = foreign_run
    assert main(["eval", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--use-run-reward" in err
    assert f"add reward.custom_fn_path={run_dir / 'reward.py'}" in err
    assert not markers["reward"].exists() and not markers["algorithm"].exists()


def test_a_named_reward_file_is_imported_only_confined(foreign_run, capsys):
    # Named on the command line, the file is used, but imported in a reward worker confined as
    # the run's are (reward.manager.sandbox from config.yaml is not taken): its write fails.
    run_dir, markers = foreign_run
    assert main(["eval", str(run_dir), f"reward.custom_fn_path={run_dir / 'reward.py'}"]) == 2
    err = capsys.readouterr().err
    assert "importing reward file" in err and "PermissionError" in err and "reward workers are confined" in err
    assert not markers["reward"].exists() and not markers["algorithm"].exists()


@pytest.mark.slow  # the export itself runs (4 min here under a load of 40 on 2 cores)
def test_export_and_eval_of_a_foreign_run_never_import_its_reward_file(tmp_path, tiny_config, capsys):
    """The report's case with only the settings every version has: config.yaml names a reward
    file planted in the run directory; export needs no reward, eval was not told to use it."""
    run_dir = tmp_path / "run"
    write_run_checkpoint(run_dir)
    cfg = tiny_config("resources.world_size=1")
    save_config(cfg, run_dir / "config.yaml")
    base_model_path(cfg, run_dir, write_builtin=True)
    marker = tmp_path / "reward-ran"
    tree = yaml.safe_load((run_dir / "config.yaml").read_text())
    tree["reward"]["custom_fn_path"] = str(planted(run_dir, "reward.py", marker))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(tree))
    main(["export", str(run_dir), "--out", str(tmp_path / "exported")])
    assert not marker.exists()
    assert main(["eval", str(run_dir)]) == 2
    assert not marker.exists() and "--use-run-reward" in capsys.readouterr().err
