"""Every file of a run checkpoint checked on the controller, before Ray or any worker starts.

    verify_checkpoint(checkpoint_dir)   # raises a UserInputError naming the file, in one line

What the workers and the resumed controller will read is read here first, the way they
read it (nothing in it can run code): each DCP checkpoint (`.metadata` and every entry of
its shards: engines/train/dcp_reader.py `verify_dcp`), every `torch.save` file (tensors and
plain data only; the tensors' data is mapped, not read), every saved batch (`*.dataproto`)
and an environment run's runner states. A tampered, cut or damaged file is then one line
naming it (exit status 2), not a worker's traceback a minute later.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from hybridflow.engines.train.checkpoint import load_plain
from hybridflow.engines.train.dcp_reader import METADATA_FILE, verify_dcp
from hybridflow.protocol import DataProto


def verify_checkpoint(checkpoint_dir: str | Path) -> None:
    """Read every file of `checkpoint_dir` as its loader will (module docstring)."""
    root = Path(checkpoint_dir)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    for metadata in (p for p in files if p.name == METADATA_FILE):
        verify_dcp(metadata.parent)
    for file in (p for p in files if p.suffix == ".pt"):
        load_plain(file, mmap=_is_zip(file))  # a file that is no zip archive is refused unmapped
    for file in (p for p in files if p.suffix == ".dataproto"):
        DataProto.load(file)
    from hybridflow.trainer.env.state import RUNNERS_STEM, load_env_state

    if (root / f"{RUNNERS_STEM}.json").is_file() or (root / "runners.pkl").is_file():
        load_env_state(root)


def _is_zip(file: Path) -> bool:
    try:
        return zipfile.is_zipfile(file)
    except zipfile.BadZipFile:  # a damaged end record
        return False
