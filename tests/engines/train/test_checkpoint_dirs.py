"""The atomic directory protocol shared by engine checkpoints and the RL trainer's run
checkpoints (hybridflow/engines/train/checkpoint.py): write into `.tmp-`, publish by
rename, replace a same-named directory without a moment without one, prune old ones.
Plain files only: no process group needed."""

from __future__ import annotations

import pytest

from hybridflow.engines.train.checkpoint import (
    begin_atomic_dir,
    prune_atomic_dirs,
    publish_atomic_dir,
    write_text_atomically,
)


def _save(root, name: str, text: str):
    tmp = begin_atomic_dir(root / name)
    (tmp / "data.txt").write_text(text)
    return publish_atomic_dir(tmp)


def test_publish_replaces_a_same_named_directory_and_clears_leftovers(tmp_path):
    first = _save(tmp_path, "global_step_1", "old")
    stale = begin_atomic_dir(tmp_path / "global_step_2")  # an interrupted write
    (stale / "half.txt").write_text("never finished")
    again = _save(tmp_path, "global_step_1", "new")  # the same step saved again
    assert again == first and (again / "data.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1"]  # no .tmp-* left
    with pytest.raises(ValueError, match="not a directory from begin_atomic_dir"):
        publish_atomic_dir(first)


def test_prune_keeps_the_new_directory_and_the_newest_others(tmp_path):
    dirs = [_save(tmp_path, f"global_step_{n}", str(n)) for n in (1, 2, 3, 4)]
    assert prune_atomic_dirs(dirs, keep_last=2, keep=dirs[-1]) == dirs[:2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3", "global_step_4"]
    # Resumed from an older step: the directory just written is kept even though newer
    # ones sort after it.
    older = _save(tmp_path, "global_step_2", "resumed")
    existing = sorted(tmp_path.iterdir(), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    assert prune_atomic_dirs(existing, keep_last=2, keep=older) == [tmp_path / "global_step_3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2", "global_step_4"]
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        prune_atomic_dirs(existing, keep_last=0, keep=older)


def test_write_text_atomically_replaces_the_whole_file(tmp_path):
    path = tmp_path / "pointer.txt"
    write_text_atomically(path, "1")
    write_text_atomically(path, "22")
    assert path.read_text() == "22" and sorted(p.name for p in tmp_path.iterdir()) == ["pointer.txt"]
