"""`hybridflow plan` and `hybridflow.planner.plan` on a simulated cluster (no runs)."""

from __future__ import annotations

import json

from hybridflow.cli import main
from hybridflow.config.schema import load_run_config
from hybridflow.planner import LLAMA, Cluster, plan

PAPERISH = ["algorithm.name=ppo", "data.train_batch_size=64", "rollout.n=1", "data.prompt.max_prompt_length=512",
            "rollout.response_length=512", "model.builtin.max_position_embeddings=2048",
            "actor.micro_batch.mini_batch_size=64", "critic.micro_batch.mini_batch_size=64",
            "actor.micro_batch.micro_batch_size_per_device=2", "critic.micro_batch.micro_batch_size_per_device=2"]


def test_plan_returns_the_fastest_mappings_first():
    cfg = load_run_config(None, PAPERISH)
    mappings = plan(cfg, Cluster.of(2, 8, "a100-80gb"), top=4, model=LLAMA["llama-7b"])
    assert len(mappings) == 4
    assert [m.step_s for m in mappings] == sorted(m.step_s for m in mappings)
    for m in mappings:
        assert sum(p.devices for p in m.pools) == 16 and set(m.parallel) == {"actor", "critic"}
        assert all(b <= 80e9 * 0.9 for b in m.peak_bytes)


def test_cli_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = main(["plan", "--nodes", "8", "--devices-per-node", "8", "--device", "a100-80gb", "--model", "llama-70b",
                 "--runtime", "paper", "--top", "3", "--json", str(out), *PAPERISH])
    printed = capsys.readouterr().out
    assert code == 0 and "rejected (" in printed and "usable at" in printed  # 70B on 64 GPUs: many do not fit
    result = json.loads(out.read_text())
    assert len(result["mappings"]) == 3 and result["cluster"]["device"]["name"] == "a100-80gb"
    assert result["mappings"][0]["step_s"] <= result["mappings"][1]["step_s"]
    assert main(["plan", "--model", "llama-5b", *PAPERISH]) == 2


def test_the_tiny_default_on_a_big_cluster_says_why_and_how_to_plan_a_real_model(capsys, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the shown command names examples/ from the repo root
    assert main(["plan", "--nodes", "16", "--devices-per-node", "8", "--device", "a100-80gb"]) == 1
    printed = capsys.readouterr().out
    assert "no mapping fits" in printed and "built-in tiny model" in printed and "128 devices" in printed
    hint = printed.strip().splitlines()[-1].strip()
    assert hint.startswith("hybridflow plan --config examples/plan_paper_ppo.yaml") and "--model llama-70b" in hint
    # The command it shows works.
    args = hint.split()[1:] + ["--runtime", "paper", "--top", "1"]
    assert main(args) == 0 and "1. " in capsys.readouterr().out
