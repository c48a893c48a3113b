"""The README's cluster start is docs/resilience.md's, the one the cluster fixture runs
(netns.py reads it from the page), and both pages' `hybridflow train` line on the cluster
is a valid command and config. No root needed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from netns import DOCS, recipe

from hybridflow.cli import parse_args
from hybridflow.config.loader import load_config
from hybridflow.config.schema import RunConfig

README = DOCS.parents[1] / "README.md"
REPO = DOCS.parents[1]


def train_line(page: Path, heading: str) -> list[str]:
    section = page.read_text().split(heading, 1)[1]
    block = next(b for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S) if "hybridflow train" in b)
    (line,) = [line for line in block.replace("\\\n", " ").splitlines() if line.strip().startswith("hybridflow")]
    return shlex.split(line.replace("HEAD_IP", "10.0.0.1"), comments=True)


def test_the_readme_starts_a_cluster_with_the_commands_the_tests_run():
    assert recipe("10.0.0.1", README, "## Running on a Ray cluster") == recipe("10.0.0.1")


def test_the_cluster_train_line_of_both_pages_is_a_valid_run():
    lines = [train_line(DOCS, "### Starting a cluster"), train_line(README, "## Running on a Ray cluster")]
    assert lines[0] == lines[1]
    args = parse_args(lines[0][1:])
    cfg = load_config(RunConfig, REPO / args.config, args.overrides)
    assert (cfg.resources.ray_address, cfg.resources.nodes, cfg.resources.world_size) == ("10.0.0.1:6379", 2, 16)
