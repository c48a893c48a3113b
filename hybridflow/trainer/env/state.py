"""What an environment run's checkpoint holds besides the learner, written so that reading
it back cannot run code planted in it.

    save_env_state(checkpoint_dir, runner_states, pending)       # EnvironmentPart.save
    runner_states, pending, note = load_env_state(checkpoint_dir)  # EnvironmentPart.load
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Any

from hybridflow.errors import DamagedFileError
from hybridflow.protocol import DataProto
from hybridflow.protocol.plain_state import load_plain_state, save_plain_state

RUNNERS_STEM = "runners"
PENDING_DIR = "pending"
KEY_ENV = "HYBRIDFLOW_STATE_KEY"
_ENVS = "envs"  # the key of the pickled environments in a runner's state (Collector.state_dict)


def save_env_state(directory: Path, runner_states: list[dict[str, Any]], pending: list[DataProto]) -> None:
    """Write the runners' states and the pending batches into the checkpoint `directory`."""
    plain = []
    for rank, state in enumerate(runner_states):
        envs = state.get(_ENVS)
        if envs is not None:
            file = directory / f"envs_rank{rank}.pkl"
            file.write_bytes(envs)
            envs = {"file": file.name, "hmac": _sign(envs)}
        plain.append({**state, _ENVS: envs})
    save_plain_state(directory / RUNNERS_STEM, plain)
    (directory / PENDING_DIR).mkdir()
    for i, batch in enumerate(pending):
        batch.save(directory / PENDING_DIR / f"{i}.dataproto")


def load_env_state(directory: Path) -> tuple[list[dict[str, Any]], list[DataProto], str | None]:
    """(runner states, pending batches, a note when environments were not restored or None)."""
    if (directory / "runners.pkl").is_file() and not (directory / f"{RUNNERS_STEM}.json").is_file():
        raise DamagedFileError(f"{directory} was written by an older hybridflow that pickled the env runners' state "
                         "(runners.pkl); it is not unpickled (code inside could run). Start a new run, or resume it "
                         "with the hybridflow version that wrote it")
    states = load_plain_state(directory / RUNNERS_STEM)
    if not isinstance(states, list) or not all(isinstance(state, dict) for state in states):
        raise DamagedFileError(f"{directory / RUNNERS_STEM}.json holds no list of env runner states: the checkpoint "
                               "is damaged")
    refused = []
    for rank, state in enumerate(states):
        signed = state.get(_ENVS)
        if signed is not None and not (isinstance(signed, dict) and isinstance(signed.get("file"), str)
                                       and Path(signed["file"]).name == signed["file"]):
            raise DamagedFileError(f"{directory / RUNNERS_STEM}.json: env runner {rank}'s environments entry is not "
                                   "what hybridflow writes: the checkpoint is damaged")
        state[_ENVS] = None if signed is None else _verified(directory / signed["file"], signed.get("hmac"))
        if signed is not None and state[_ENVS] is None:
            refused.append(rank)
    count = len(list((directory / PENDING_DIR).glob("*.dataproto")))
    pending = [DataProto.load(directory / PENDING_DIR / f"{i}.dataproto") for i in range(count)]
    note = None
    if refused:
        note = (f"the environments of env runner(s) {refused} in {directory} are not signed with this user's key "
                f"({key_path()}): not unpickled (code inside could run); their episodes in progress restart")
    return states, pending, note


def key_path() -> Path:
    """The per-user signing key's file (outside every run directory)."""
    return Path(os.environ.get(KEY_ENV) or Path.home() / ".config" / "hybridflow" / "state.key")


def _key(create: bool) -> bytes | None:
    path = key_path()
    if not path.is_file():
        if not create:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another run made it meanwhile: use that one
            return path.read_bytes()
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    return path.read_bytes()


def _sign(data: bytes) -> str:
    key = _key(create=True)
    assert key is not None
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def _verified(file: Path, signature: Any) -> bytes | None:
    """The bytes of `file` when they carry a valid signature under this user's key, else None."""
    key = _key(create=False)
    if key is None or not isinstance(signature, str) or not file.is_file():
        return None
    data = file.read_bytes()
    return data if hmac.compare_digest(hmac.new(key, data, hashlib.sha256).hexdigest(), signature) else None
