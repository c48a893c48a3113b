"""docs/migrating.md says what each verl and TRL key becomes: every row of its tables is
checked against the translation, and every key the translation tables map has a row.

    .venv/bin/python -m pytest -q tests/config/test_migrating_doc.py
"""

from __future__ import annotations

import dataclasses
import re
from operator import attrgetter
from pathlib import Path

import pytest
import yaml
from compat_helpers import VERL as VERL_FILES

from hybridflow.config import ConfigError
from hybridflow.config.compat.engine import _is_pattern, leaves, translate
from hybridflow.config.compat.interpolate import resolve_references
from hybridflow.config.compat.trl import TRL
from hybridflow.config.compat.verl import VERL, verl_metrics
from hybridflow.config.loader import with_overrides
from hybridflow.config.schema import RunConfig

DOC = Path(__file__).parents[2] / "docs" / "migrating.md"
# the rows of a key alone (data.shuffle is a key of both) are read as verl's
AS_VERL = dataclasses.replace(VERL, detects=lambda tree: True)
# verl's defaults that name things rather than set them (the doc says so)
PLACEHOLDERS = {"actor_rollout_ref.model.path", "critic.model.path", "data.train_files", "data.val_files",
                "trainer.project_name", "trainer.experiment_name", "trainer.default_local_dir"}


def tables() -> dict[str, list[list[str]]]:
    """The doc's table rows (cells) under each ### / ## heading."""
    out: dict[str, list[list[str]]] = {}
    heading = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("#"):
            heading = line.lstrip("# ").strip()
        elif line.startswith("| ") and not line.startswith("| ---"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if "`" in cells[0] or cells[0] == "(the step)":
                out.setdefault(heading, []).append(cells)
    return out


def spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def pairs(cell: str) -> dict:
    return {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in spans(cell))}


def native(value):
    return list(value) if isinstance(value, tuple) else value


def same(a, b) -> bool:
    """Equal, numbers written either way ("1e-05" is a string to YAML) counting as numbers."""
    try:
        return a == b or float(a) == float(b)
    except (TypeError, ValueError):
        return False


def rows_of(*headings: str) -> list[list[str]]:
    found = tables()
    return [row for heading in headings for row in found[heading]]


def check_row(dialect, row: list[str]) -> None:
    given, result = spans(row[0]), row[1]
    key = given[0].split("=")[0]
    if result == "refused":
        with pytest.raises(ConfigError):
            translate(dialect, with_overrides({}, given), RunConfig)
        return
    tree, report = translate(dialect, with_overrides({}, given), RunConfig)
    if result == "not used":
        assert key in {k for k, *_ in report.unused}, row
        return
    got = dict(leaves(tree))
    for native_key, value in pairs(result).items():
        assert native_key in got and same(got[native_key], value), (row, native_key, got.get(native_key))


@pytest.mark.parametrize("row", rows_of("Keys that map", "Keys with no meaning here"), ids=lambda r: spans(r[0])[0])
def test_each_verl_row_maps_as_the_doc_says(row):
    check_row(AS_VERL, row)


@pytest.mark.parametrize("row", rows_of("TRL"), ids=lambda r: spans(r[0])[0])
def test_each_trl_row_maps_as_the_doc_says(row):
    check_row(TRL, row)


@pytest.mark.parametrize("dialect, heading", [(VERL, "Keys that map"), (TRL, "TRL")])
def test_every_key_that_maps_has_a_row(dialect, heading):
    documented = {spans(row[0])[0].split("=")[0] for row in rows_of(heading)}
    mapped = {row.key for row in dialect.rows if row.convert is not None and not _is_pattern(row.key)}
    assert mapped <= documented, sorted(mapped - documented)


def verl_defaults() -> dict:
    tree = yaml.safe_load((VERL_FILES / "ppo_trainer_generated.yaml").read_text())
    return dict(leaves(resolve_references(tree)))


def test_each_default_that_differs_is_as_the_doc_says():
    defaults, ours = verl_defaults(), RunConfig()
    for key, theirs, mine in rows_of("Where hybridflow's default differs from verl's"):
        assert same(defaults[spans(key)[0]], yaml.safe_load(spans(theirs)[0])), key
        for native_key, value in pairs(mine).items():
            assert same(native(attrgetter(native_key)(ours)), value), (key, native_key)


def test_every_default_that_differs_is_in_the_doc():
    """verl's defaults, each translated: where it lands on another value than hybridflow's
    own default, the doc's table lists the key."""
    listed = {spans(row[0])[0] for row in rows_of("Where hybridflow's default differs from verl's")}
    ours, differing = RunConfig(), set()
    for key, value in verl_defaults().items():
        row = VERL.row_of(key)
        if row is None or row.convert is None or value is None or key in PLACEHOLDERS:
            continue
        try:
            _, report = translate(AS_VERL, {key: value} if "." not in key else _nested(key, value), RunConfig)
        except ConfigError:
            continue  # a value that needs a key beside it (reward_model.model.input_tokenizer)
        for _, _, out, _ in (m for m in report.mapped if m[0] == key):
            if any(not same(translated, native(attrgetter(k)(ours))) for k, translated in out.items()):
                differing.add(key)
    assert differing <= listed, sorted(differing - listed)
    assert len(differing) > 20  # the check has something to check


@pytest.mark.parametrize("row", rows_of("verl's metric names"), ids=lambda r: r[1])
def test_each_metric_has_verls_name(row):
    theirs = spans(row[1])[0]
    if row[0] == "(the step)":
        assert verl_metrics(7, {"score/mean": 0.5}, 1)[theirs] == 7
        return
    assert verl_metrics(7, {spans(row[0])[0]: 0.25}, 1)[theirs] == 0.25


def _nested(key: str, value) -> dict:
    tree: dict = {}
    node = tree
    for part in key.split(".")[:-1]:
        node = node.setdefault(part, {})
    node[key.split(".")[-1]] = value
    return tree
