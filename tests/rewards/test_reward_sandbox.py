"""Reward workers are confined by default (reward.manager.sandbox): a reward function that
writes to /tmp, reads a file outside what it needs (~/.bashrc, another directory), opens a
socket to 127.0.0.1 or runs a program fails that sample with a clear error, while reading
its own directory and `readable_paths` works; a sample past its CPU seconds is
interrupted. With sandbox=false (and allow_subprocess=true) the same function can do all
of it; the file-size limit stays. No process can be started unless
reward.manager.allow_subprocess (root included), and those started then die with their
worker and with the run, a `setsid` grandchild included; the workers' environment holds
only allow-listed variables (and those passed through by name)."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hybridflow.rewards import RewardConfig, RewardManager, load_reward_fn
from hybridflow.rewards.limits import auto_memory_limit_mb, machine_memory_mb, readable_paths, worker_limits
from test_reward_manager import make_batch, tokenizer  # noqa: F401 - the fixture

REWARD_FILE = textwrap.dedent(
    '''
    import ctypes, os, socket, subprocess, time
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
        elif action == "fork":
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        elif action == "orphan":  # a detached grandchild named `arg`, left running
            child = os.fork()
            if child == 0:
                os.setsid()
                if os.fork() == 0:
                    ctypes.CDLL(None).prctl(15, arg.encode(), 0, 0, 0)  # PR_SET_NAME
                    time.sleep(600)
                os._exit(0)
            os.waitpid(child, 0)
        elif action == "env":
            try:
                environ = Path("/proc/self/environ").read_bytes()
            except PermissionError:  # confined: /proc is not readable at all
                environ = b""
            return {"score": 1.0, "seen": os.environ.get(arg, ""), "in_proc": float(arg.encode() in environ)}
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
    config = RewardConfig(num_workers=1, timeout_s=10.0, max_failed_steps=0, sandbox=False, file_size_limit_mb=1,
                          allow_subprocess=True)
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


@pytest.mark.parametrize("sandbox", [True, False])
def test_no_process_can_be_started_unless_allowed(tokenizer, setup, sandbox):
    # We run as root in CI: RLIMIT_NPROC would not bind; the seccomp filter does.
    config = RewardConfig(num_workers=1, timeout_s=10.0, max_failed_steps=0, sandbox=sandbox)
    out = score(tokenizer, setup["fn"], config, ["fork:", "run:", "1"])
    errors = dict(out.errors)
    for i in (0, 1):
        assert "PermissionError" in errors[i] and "reward.manager.allow_subprocess=true" in errors[i], errors[i]
    assert 2 not in errors  # the worker goes on scoring
    allowed = RewardConfig(num_workers=1, timeout_s=10.0, max_failed_steps=0, sandbox=sandbox, allow_subprocess=True)
    assert not score(tokenizer, setup["fn"], allowed, ["fork:"]).errors


def named_processes(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == name:
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def wait_until_gone(name: str) -> None:
    # The mechanism (the worker's PID namespace dies with it), not a time: the pytest
    # timeout only guards against a survivor.
    while named_processes(name):
        time.sleep(0.1)


@pytest.mark.timeout(300)
def test_a_setsid_grandchild_dies_with_its_worker(tokenizer, setup):
    name = f"hforphan{os.getpid() % 10**6}"
    config = RewardConfig(num_workers=1, timeout_s=10.0, max_failed_steps=0, allow_subprocess=True)
    manager = RewardManager(tokenizer, config, setup["fn"])
    try:
        assert not manager(make_batch(tokenizer, ["x"], [f"orphan:{name}"])).errors
        assert len(named_processes(name)) == 1  # detached, running, while the worker lives
    finally:
        manager.close()
    wait_until_gone(name)


OWNER = textwrap.dedent(
    '''
    import sys, time
    from hybridflow.data import build_char_tokenizer
    from hybridflow.rewards import RewardConfig, RewardManager, load_reward_fn
    from test_reward_manager import make_batch

    if __name__ == "__main__":
        tokenizer = build_char_tokenizer()
        config = RewardConfig(num_workers=1, timeout_s=10.0, max_failed_steps=0, allow_subprocess=True)
        manager = RewardManager(tokenizer, config, load_reward_fn(sys.argv[1], "compute_score"))
        out = manager(make_batch(tokenizer, ["x"], ["orphan:" + sys.argv[2]]))
        print("scored" if not out.errors else out.errors, flush=True)
        time.sleep(600)
    '''
)


@pytest.mark.timeout(300)
def test_a_setsid_grandchild_dies_with_a_killed_controller(setup, tmp_path):
    name = f"hfkilled{os.getpid() % 10**6}"
    (tmp_path / "owner.py").write_text(OWNER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path])}
    owner = subprocess.Popen([sys.executable, str(tmp_path / "owner.py"), str(setup["fn"].path), name],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert owner.stdout.readline().strip() == "scored"
        assert len(named_processes(name)) == 1
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        wait_until_gone(name)  # the worker exits with the controller; its namespace with it
    finally:
        owner.kill()


@pytest.mark.parametrize("sandbox", [True, False])
def test_workers_do_not_see_the_controllers_secrets(tokenizer, setup, monkeypatch, sandbox):
    secret = "fake-wandb-key-0123456789"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    # spawn: a fresh worker process that inherits this environment as it is now
    config = RewardConfig(num_workers=1, timeout_s=10.0, max_failed_steps=0, sandbox=sandbox, mp_context="spawn")
    out = score(tokenizer, setup["fn"], config, ["env:WANDB_API_KEY", "env:PATH"])
    assert not out.errors, out.errors
    assert out.extra_info["seen"] == ["", os.environ["PATH"]]  # withheld; an allowed variable is there
    assert out.extra_info["in_proc"][0] == 0.0  # nor in the block the process started with (sandbox=false)
    passed = dataclasses.replace(config, env_passthrough=["WANDB_API_KEY"])
    assert score(tokenizer, setup["fn"], passed, ["env:WANDB_API_KEY"]).extra_info["seen"] == [secret]
