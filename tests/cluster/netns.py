"""A real Ray cluster on one Linux machine: each node a network namespace with its own `eth0`
on a bridge, Ray started in each by the lines of docs/resilience.md's "Starting a cluster"
(`recipe`: read from the page, so the page stays what was tested; Ray's token copied from
the head's home to the others'), links that go down or slow down (delay_link.py).

    cluster = NetnsCluster(root_dir, nodes=2)
    cluster.start()
    cluster.run(0, ["hybridflow", "train", f"resources.ray_address={cluster.address}", ...])
    cluster.kill_node(1); cluster.restart_node(1)
    cluster.close()

Needs root and iproute2 (`unavailable()` says why not). Names carry this process's PID, so
runs beside each other do not clash; the namespaces have their own network stacks, so
neither do ports. Every process started in a node is ended by its PID (`ip netns pids`),
never `ray stop` (which ends every Ray on the machine). `close()` removes everything, and
runs at exit too; namespaces left by a killed earlier run of this module are removed at
the next start.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.77.0"
GATEWAY = f"{SUBNET}.254"  # the bridge's own address: each node's default route, as on a real LAN
DOCS = Path(__file__).resolve().parents[2] / "docs" / "resilience.md"
# Added to the docs' `ray start` lines here only: a temp dir per start (Ray's default /tmp/ray
# belongs to whoever else runs Ray on this machine), a CPU count that fits this machine, no
# usage-stats prompt, no dashboard on the head (a web UI nothing here uses).
TEST_FLAGS = ("--disable-usage-stats",)
PREFIX = "hfc"  # namespace names: hfc<pid>[name]sw (the switch), hfc<pid>[name]n<i> (node i)
VENV_BIN = Path(sys.executable).parent
# What a node's Ray must not inherit from the test process.
DROPPED_ENV = ("RAY_", "GLOO_", "NCCL_", "HYBRIDFLOW_")


def unavailable() -> str | None:
    """Why a namespace cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` command is missing"
    if not Path("/dev/net/tun").exists():
        return "/dev/net/tun is missing (the delayed link needs it)"
    return None


@dataclass(frozen=True)
class Command:
    """One line of the docs' recipe: environment assignments, then the command."""

    env: dict[str, str]
    argv: list[str]


def recipe(head_ip: str, page: Path = DOCS, heading: str = "### Starting a cluster") -> dict[str, Command]:
    """The cluster start of `page` (the first bash block after `heading`), HEAD_IP filled in:
    {"token": make the token, "head": start the head, "join": start every other node}."""
    section = page.read_text().split(heading, 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    found: dict[str, Command] = {}
    for line in block.replace("\\\n", " ").replace("&&", "\n").splitlines():
        words = shlex.split(line.replace("HEAD_IP", head_ip), comments=True)
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        if words[:2] == ["ray", "get-auth-token"]:
            found["token"] = Command(env, words)
        elif words[:2] == ["ray", "start"]:
            found["head" if "--head" in words else "join"] = Command(env, words)
    assert set(found) == {"token", "head", "join"}, f"{page}: the recipe lost a line: {sorted(found)}"
    return found


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


@dataclass(frozen=True)
class Node:
    index: int
    ns: str
    ip: str
    home: Path  # the node's own home: Ray's token lives in ~/.ray/auth_token


class NetnsCluster:
    """`nodes` namespaces on one bridge, a Ray node in each (head first)."""

    def __init__(self, root: Path, nodes: int = 2, cpus_per_node: int = 4, name: str = "") -> None:
        """`name` (letters): tells apart two clusters of one test process."""
        self.root = Path(root)
        self.tag = f"{PREFIX}{os.getpid()}{name}"
        self.switch = f"{self.tag}sw"
        self.cpus = cpus_per_node
        self.nodes = [Node(i, f"{self.tag}n{i}", f"{SUBNET}.{i + 1}", self.root / f"home{i}") for i in range(nodes)]
        self.recipe = recipe(self.nodes[0].ip)
        port = next(w.split("=", 1)[1] for w in self.recipe["head"].argv if w.startswith("--port="))
        self.address = f"{self.nodes[0].ip}:{port}"
        self._starts = [0] * nodes  # ray starts per node (each gets a fresh temp dir)
        self._links: list[subprocess.Popen] = []
        self._slowed: set[int] = set()  # nodes whose path to the head goes through a delayed link
        self._closed = False

    # ------------------------------------------------------------------ building

    def start(self) -> None:
        remove_stale()
        atexit.register(self.close)
        self._build_network()
        self._make_token()
        for node in self.nodes:
            self.start_ray(node.index)
        self.wait_for_nodes(len(self.nodes))

    def _build_network(self) -> None:
        sh("ip", "netns", "add", self.switch)
        sw = ("ip", "-n", self.switch)
        sh(*sw, "link", "set", "lo", "up")
        sh(*sw, "link", "add", "br0", "type", "bridge")
        sh(*sw, "addr", "add", f"{GATEWAY}/24", "dev", "br0")
        sh(*sw, "link", "set", "br0", "up")
        for node in self.nodes:
            sh("ip", "netns", "add", node.ns)
            n = ("ip", "-n", node.ns)
            sh(*sw, "link", "add", self.port(node.index), "type", "veth", "peer", "name", "eth0", "netns", node.ns)
            sh(*sw, "link", "set", self.port(node.index), "master", "br0", "up")
            sh(*n, "link", "set", "lo", "up")
            sh(*n, "addr", "add", f"{node.ip}/24", "dev", "eth0")
            sh(*n, "link", "set", "eth0", "up")
            sh(*n, "route", "add", "default", "via", GATEWAY)
            node.home.mkdir(parents=True, exist_ok=True)

    def _make_token(self) -> None:
        """The recipe: generate the token on the head, copy it to every other node."""
        head, make = self.nodes[0], self.recipe["token"]
        done = self.run(0, make.argv, env=make.env, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(make.argv)} failed:\n{done.stderr[-2000:]}")
        token = head.home / ".ray" / "auth_token"
        for node in self.nodes[1:]:
            (node.home / ".ray").mkdir(parents=True, exist_ok=True)
            shutil.copy(token, node.home / ".ray" / "auth_token")

    def port(self, index: int) -> str:
        """The switch's end of node `index`'s cable."""
        return f"p{index}"

    # ------------------------------------------------------------------ Ray

    def env(self, node: Node, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a process on `node`: this one's, without Ray / network /
        fault variables, with the node's own home."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_ENV)}
        env.update(HOME=str(node.home), PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}")
        env.update(extra or {})
        return env

    def start_ray(self, index: int, attempts: int = 2) -> None:
        """The recipe's `ray start` on node `index` (the head's line on node 0, the joining
        line on the others) with TEST_FLAGS, this machine's CPU count and a temp dir of its own.
        On a loaded machine Ray may give up waiting for its own processes: one more try."""
        line = self.recipe["head" if index == 0 else "join"]
        for attempt in range(attempts):
            self._starts[index] += 1
            flags = [*TEST_FLAGS, f"--num-cpus={self.cpus}",
                     f"--temp-dir={self.root / f'ray{index}-{self._starts[index]}'}"]
            if index == 0:
                flags.append("--include-dashboard=false")
            done = self.run(index, [*line.argv, *flags], env=line.env, timeout=240)
            if done.returncode == 0:
                return
            self.kill_node(index)  # what the failed start left
        raise RuntimeError(f"ray start on node {index} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")

    def wait_for_nodes(self, count: int, timeout_s: float = 180.0) -> None:
        """Until Ray lists `count` alive nodes, one per IP (a restarted node registers anew;
        its old entry must be declared dead first)."""
        probe = ("import ray, sys, time\n"
                 f"ray.init(address='{self.address}', logging_level='ERROR')\n"
                 f"deadline = time.monotonic() + {timeout_s}\n"
                 "while time.monotonic() < deadline:\n"
                 "    ips = [n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']]\n"
                 f"    if len(ips) == len(set(ips)) == {count}: sys.exit(0)\n"
                 "    time.sleep(0.5)\n"
                 "sys.exit(1)\n")
        done = self.run(0, [sys.executable, "-c", probe], timeout=timeout_s + 60,
                        env={"RAY_AUTH_MODE": "token"})
        if done.returncode != 0:
            raise RuntimeError(f"the cluster did not reach {count} alive node(s):\n{done.stderr[-2000:]}")

    # ------------------------------------------------------------------ processes

    def command(self, index: int, argv: Sequence[str]) -> list[str]:
        """`argv` run inside node `index` (a bare program name is taken from the venv)."""
        program = argv[0]
        if "/" not in program and (VENV_BIN / program).exists():
            program = str(VENV_BIN / program)
        return ["ip", "netns", "exec", self.nodes[index].ns, program, *argv[1:]]

    def run(self, index: int, argv: Sequence[str], env: dict[str, str] | None = None,
            timeout: float = 600.0, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(index, argv), env=self.env(self.nodes[index], env), capture_output=True,
                              text=True, timeout=timeout, cwd=cwd)

    def popen(self, index: int, argv: Sequence[str], env: dict[str, str] | None = None,
              **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(index, argv), env=self.env(self.nodes[index], env), **kwargs)

    def pids(self, index: int) -> list[int]:
        """Every process in node `index`'s namespace (all started by this cluster)."""
        out = sh("ip", "netns", "pids", self.nodes[index].ns, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_node(self, index: int) -> None:
        """The machine is lost: SIGKILL every process of the node at once."""
        _kill_all(lambda: self.pids(index))

    def raylet_running(self, index: int) -> bool:
        for pid in self.pids(index):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                    return True
        return False

    def heal(self) -> None:
        """Every cable plugged in, every node's Ray running (restarted where a test lost it)."""
        for node in self.nodes:
            self.link(node.index, up=True)
        lost = [node.index for node in self.nodes[1:] if not self.raylet_running(node.index)]
        for index in lost:
            self.kill_node(index)
            self.start_ray(index)
        if lost:
            self.wait_for_nodes(len(self.nodes))

    def restart_node(self, index: int) -> None:
        """Bring a lost node back: `ray start` again, then wait until Ray has it once."""
        self.kill_node(index)
        self.start_ray(index)
        self.wait_for_nodes(len(self.nodes))

    # ------------------------------------------------------------------ links

    def link(self, index: int, up: bool) -> None:
        """Unplug (or plug back) node `index`'s cables: its port at the switch and, while the
        path to it is slowed, its end of the delayed link (whose host route the kernel drops
        with the device, so it is put back)."""
        state = "up" if up else "down"
        sh("ip", "-n", self.switch, "link", "set", self.port(index), state)
        if index in self._slowed:
            node = self.nodes[index]
            sh("ip", "-n", node.ns, "link", "set", "hfd", state)
            if up:
                sh("ip", "-n", node.ns, "route", "replace", f"{self.nodes[0].ip}/32", "dev", "hfd")

    @contextlib.contextmanager
    def slowed(self, index: int, delay_ms: float, rate_mbit: float) -> Iterator[None]:
        """Traffic between the head and node `index` goes through a link that delays every
        packet by `delay_ms` in each direction (delay_link.py, a userspace forwarder between
        two tun devices: this kernel has no netem) and carries at most `rate_mbit` each way
        (tc tbf). Existing connections move to it (host routes), and back afterwards."""
        head, node = self.nodes[0], self.nodes[index]
        link = subprocess.Popen([sys.executable, str(Path(__file__).with_name("delay_link.py")), head.ns, node.ns,
                                 str(delay_ms)], stdout=subprocess.PIPE, text=True)
        self._links.append(link)
        self._slowed.add(index)
        try:
            assert link.stdout is not None and link.stdout.readline().strip() == "ready", "delay link did not start"
            for here, there in ((head, node), (node, head)):
                n = ("ip", "-n", here.ns)
                sh(*n, "link", "set", "hfd", "up")
                limit_rate(here.ns, "hfd", rate_mbit)
                sh(*n, "route", "add", f"{there.ip}/32", "dev", "hfd")
            yield
        finally:
            for here, there in ((head, node), (node, head)):
                sh("ip", "-n", here.ns, "route", "del", f"{there.ip}/32", check=False)
            link.kill()
            link.wait()
            self._links.remove(link)
            self._slowed.discard(index)

    def round_trip_ms(self, index: int) -> float:
        """Median time of a TCP connect (one round trip) from node `index` to the head's Ray port."""
        host, port = self.address.rsplit(":", 1)
        probe = ("import socket, statistics, time\n"
                 "seconds = []\n"
                 "for _ in range(7):\n"
                 "    start = time.perf_counter()\n"
                 f"    socket.create_connection(({host!r}, {port}), timeout=10).close()\n"
                 "    seconds.append(time.perf_counter() - start)\n"
                 "print(statistics.median(seconds) * 1000)\n")
        done = self.run(index, [sys.executable, "-c", probe], timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"round trip from node {index} failed:\n{done.stderr[-2000:]}")
        return float(done.stdout.strip())

    @contextlib.contextmanager
    def rate_limited(self, index: int, rate_mbit: float) -> Iterator[None]:
        """Node `index`'s cable carries at most `rate_mbit` each way (tc tbf on both of its
        ends, in the kernel; no added delay)."""
        ends = [(self.switch, self.port(index)), (self.nodes[index].ns, "eth0")]
        try:
            for ns, dev in ends:
                limit_rate(ns, dev, rate_mbit)
            yield
        finally:
            for ns, dev in ends:
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for link in self._links:
            link.kill()
        for node in self.nodes:
            self.kill_node(node.index)
        for ns in [n.ns for n in self.nodes] + [self.switch]:
            sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(self.root, ignore_errors=True)  # the nodes' homes and Ray logs


def limit_rate(ns: str, dev: str, rate_mbit: float) -> None:
    """What leaves `dev` in namespace `ns`: at most `rate_mbit` (tc tbf, 64 KB bursts)."""
    sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
       "burst", "64kb", "latency", "400ms")


def _kill_all(pids_now, timeout_s: float = 30.0) -> None:
    """SIGKILL every PID `pids_now()` lists until it lists none (children started meanwhile too)."""
    deadline = time.monotonic() + timeout_s
    while (pids := pids_now()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def remove_stale() -> None:
    """Namespaces of this module whose owning test process is gone (a killed earlier run)."""
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = re.match(rf"{PREFIX}(\d+)", name)
        if owner is None or Path(f"/proc/{owner.group(1)}").exists():
            continue
        _kill_all(lambda: [int(p) for p in sh("ip", "netns", "pids", name, check=False).stdout.split()])
        sh("ip", "netns", "del", name, check=False)
