"""Reward workers are confined by default (reward.manager.sandbox): a reward function that
writes to /tmp, reads a file outside what it needs (~/.bashrc, another directory), opens a
socket to 127.0.0.1 or runs a program fails that sample with a clear error, while reading
its own directory and `readable_paths` works; a sample past its CPU seconds is
interrupted. With sandbox=false the same function can do all of it; the file-size limit
stays."""

from __future__ import annotations

import os
import socket
import textwrap
from pathlib import Path

import pytest

from hybridflow.rewards import RewardConfig, RewardManager, load_reward_fn
from hybridflow.rewards.limits import auto_memory_limit_mb, machine_memory_mb, readable_paths, worker_limits
from test_reward_manager import make_batch, tokenizer  # noqa: F401 - the fixture

REWARD_FILE = textwrap.dedent(
    '''
    import os, socket, subprocess, time
    from pathlib import Path

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        action, _, arg = ground_truth.partition(":")
        if action == "write":
            Path(arg).write_text("written by a reward function")
        elif action == "read":
            return float(len(Path(os.path.expanduser(arg)).read_text()) > 0)
        elif action == "connect":
            socket.create_connection(("127.0.0.1", int(arg)), timeout=2).close()
        elif action == "run":
            subprocess.run(["/bin/true"], check=True)
        elif action == "spin":
            end = time.process_time() + float(arg)
            while time.process_time() < end:
                pass
        elif action == "big":
            Path(arg).write_bytes(bytes(3 * 1024 * 1024))
        return 1.0
    '''
)


@pytest.fixture
def setup(tmp_path):
    reward_dir = tmp_path / "reward"
    reward_dir.mkdir()
    (reward_dir / "sandbox_reward.py").write_text(REWARD_FILE)
    (reward_dir / "answers.txt").write_text("own directory")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.txt").write_text("not for rewards")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "table.txt").write_text("configured")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield {"fn": load_reward_fn(reward_dir / "sandbox_reward.py"), "tmp": tmp_path,
           "port": server.getsockname()[1], "reward_dir": reward_dir}
    server.close()


def cases(s) -> dict[str, str]:
    tmp = s["tmp"]
    return {
        "write /tmp": f"write:/tmp/hf-reward-probe-{os.getpid()}-{tmp.name}",
        "read ~/.bashrc": "read:~/.bashrc",
        "read elsewhere": f"read:{tmp / 'elsewhere' / 'secret.txt'}",
        "connect 127.0.0.1": f"connect:{s['port']}",
        "run a program": "run:",
        "read own directory": f"read:{s['reward_dir'] / 'answers.txt'}",
        "read readable_paths": f"read:{tmp / 'data' / 'table.txt'}",
    }


def score(tokenizer, fn, config: RewardConfig, truths: list[str]):
    with RewardManager(tokenizer, config, fn) as manager:
        return manager(make_batch(tokenizer, ["x"] * len(truths), truths))


def test_confined_by_default(tokenizer, setup):
    bashrc = Path("~/.bashrc").expanduser()
    created = not bashrc.exists()
    if created:
        bashrc.write_text("# made by test_reward_sandbox\n")
    try:
        config = RewardConfig(num_workers=1, timeout_s=10.0, max_failed_steps=0,
                              readable_paths=[str(setup["tmp"] / "data")])
        named = cases(setup)
        out = score(tokenizer, setup["fn"], config, list(named.values()))
    finally:
        if created:
            bashrc.unlink()
    errors = dict(out.errors)
    by_case = {name: errors.get(i) for i, name in enumerate(named)}
    assert by_case["read own directory"] is None and by_case["read readable_paths"] is None
    for name in ("write /tmp", "read ~/.bashrc", "read elsewhere", "run a program", "connect 127.0.0.1"):
        assert "PermissionError" in by_case[name] and "reward.manager.sandbox=false" in by_case[name], name
        assert "sandbox_reward.py" in by_case[name], name  # the frame named is the reward's own
    assert not Path(named["write /tmp"].partition(":")[2]).exists()


def test_the_opt_out_allows_it_and_keeps_the_file_size_limit(tokenizer, setup):
    named = cases(setup)
    target = Path(named["write /tmp"].partition(":")[2])
    big = setup["tmp"] / "big.bin"
    config = RewardConfig(num_workers=1, timeout_s=10.0, max_failed_steps=0, sandbox=False, file_size_limit_mb=1)
    truths = [named[k] for k in ("write /tmp", "read elsewhere", "connect 127.0.0.1", "run a program")]
    try:
        out = score(tokenizer, setup["fn"], config, [*truths, f"big:{big}"])
        assert out.scores.tolist()[:4] == [1.0] * 4 and target.exists()
    finally:
        target.unlink(missing_ok=True)
    assert [i for i, _ in out.errors] == [4] and "File too large" in out.errors[0][1]


def test_a_sample_past_its_cpu_seconds_is_interrupted(tokenizer, setup):
    config = RewardConfig(num_workers=1, timeout_s=30.0, cpu_time_s=1, max_failed_steps=0)
    out = score(tokenizer, setup["fn"], config, ["spin:20", "spin:0"])
    assert [i for i, _ in out.errors] == [0] and "more than 1 s of CPU time" in out.errors[0][1]
    assert out.scores.tolist()[1] == 1.0  # the same worker scores the next sample


def test_the_machine_memory_is_the_containers_where_its_cgroup_limits_it(tmp_path):
    physical = machine_memory_mb(tmp_path / "none")  # no cgroup files: the machine's memory
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("max\n")
    assert machine_memory_mb(v2) == physical
    (v2 / "memory.max").write_text(f"{2 * 2**30}\n")
    assert machine_memory_mb(v2) == min(physical, 2048)
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert machine_memory_mb(v1.parent) == physical


def test_memory_default_follows_the_machine_and_the_worker_count(setup):
    assert auto_memory_limit_mb(2, machine_mb=24 * 1024) == 3072  # not 8 GiB each on a 24 GiB machine
    assert auto_memory_limit_mb(1, machine_mb=512 * 1024) == 8192 and auto_memory_limit_mb(8, 8 * 1024) == 1024
    limits = worker_limits(RewardConfig(num_workers=2), setup["fn"])
    assert limits.memory_bytes == auto_memory_limit_mb(2) * 2**20 and limits.cpu_s == 10 and limits.sandbox
    paths = readable_paths(setup["fn"], [])
    assert str(setup["reward_dir"]) in paths and not any(p in ("/", "/tmp", str(Path.home())) for p in paths)
