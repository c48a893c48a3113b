"""Starting or joining Ray for the controller.

`init_ray()` starts an embedded single-node Ray whose services listen on 127.0.0.1 only
(dashboard off), and a reaper process that kills what is left of it if this process is
killed (reaper.py); `init_ray(address=...)` joins an existing cluster instead. Calling it
when Ray is already up in this process returns the running instance's description.
`RayHold` is how jobs (trainers, the reward-model job, eval) share that Ray in one process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import ray

from hybridflow.controller.reaper import start_reaper
from hybridflow.errors import ConfigError

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class RayRuntime:
    """What the controller is connected to."""

    address: str  # GCS address of the cluster
    embedded: bool  # True when init_ray started it (and it listens on 127.0.0.1 only)
    num_nodes: int


def init_ray(address: str | None = None, num_cpus: int | None = None) -> RayRuntime:
    """Join the Ray cluster at ``address``, or start an embedded local Ray when it is None.

    ``num_cpus`` sets the embedded instance's logical CPU count (Ray schedules by it; it
    may exceed the physical cores, e.g. to fit a test's worker groups on a small machine).
    It must be None when joining a cluster, whose nodes declare their own resources.

    Workers of the embedded instance get the controller's user import folders (script
    folder, test folders) on their path, so worker classes defined there load. On a joined
    cluster they must be importable on every node (an installed package, or a Ray
    runtime_env set up by the cluster's job submission).
    """
    if address and num_cpus is not None:
        raise ValueError(
            f"init_ray: num_cpus={num_cpus} only applies to an embedded Ray; a joined cluster "
            f"({address}) declares its own resources. Drop num_cpus or drop address."
        )
    if ray.is_initialized():
        return describe_ray()
    _drop_worker_death_notices()
    _drop_token_auth_notice()
    if address and address.startswith(LOOPBACK + ":"):
        # An embedded instance of another process on this machine (e.g. `hybridflow monitor`
        # joining a local run): stay on loopback, as it does.
        with _loopback_node_ip():
            ray.init(address=address, _node_ip_address=LOOPBACK)
        return describe_ray()
    if address:
        _token_auth_if_token_present()
        ray.init(address=address)
        return describe_ray()
    # Ray starts its workers at niceness 15, which on a shared machine hands their CPU to
    # any other job: the embedded instance runs them at the controller's priority unless
    # the user set RAY_worker_niceness. (A joined cluster keeps its own setting.)
    os.environ.setdefault("RAY_worker_niceness", "0")
    with _loopback_node_ip():
        ray.init(
            address="local",  # a new instance even when RAY_ADDRESS is set in the environment
            num_cpus=num_cpus,
            include_dashboard=False,
            _node_ip_address=LOOPBACK,
            runtime_env={"env_vars": {"PYTHONPATH": _driver_pythonpath()}},
        )
    # A SIGKILL of this process must not leave Ray's agents running (reaper.py); it reports
    # beside Ray's logs (a private accessor: without it, no report).
    node = getattr(ray._private.worker, "_global_node", None)
    start_reaper(node.get_logs_dir_path() if node is not None else None)
    return describe_ray(embedded=True)


class RayHold:
    """One job's use of Ray in this process: joins the cluster at `address`, or starts an
    embedded Ray with at least `cpus` logical CPUs, or uses the Ray already running here.

    Jobs share the Ray a hold started (or joined), and the last hold to `close` stops it, so
    closing one trainer never stops the Ray another one runs on. A job whose workers are
    stopped (`idle`: a trainer's train() returned outside `with`) holds nothing on Ray, so a
    later job whose ranks need more CPUs than the embedded Ray has starts it again, bigger,
    instead of failing to place them. A Ray the user started is never stopped or restarted.
    `key` is the setting that sizes the job (named when its ranks cannot fit).
    """

    _holds: list[RayHold] = []  # the open holds of this process
    _started = False  # whether a hold started (or joined) the running Ray

    def __init__(self, address: str | None, cpus: int, nodes: int = 1, key: str = "resources.world_size") -> None:
        self.address, self.cpus, self.nodes, self.key = address, cpus, nodes, key
        self.busy = False
        self.use(busy=False)
        RayHold._holds.append(self)

    def use(self, busy: bool = True) -> None:
        """Ray up with room for this job's ranks; `busy`: its workers start now."""
        if ray.is_initialized() and self.address is None:
            have = ray.cluster_resources().get("CPU", 0.0)
            if have < self.cpus:
                working = [h for h in RayHold._holds if h.busy]
                if not RayHold._started or working:
                    whose = ("started outside hybridflow" if not RayHold._started else
                             "in use by another trainer's workers")
                    raise ConfigError(
                        f"this run's ranks reserve {self.cpus} Ray CPUs but the Ray running in this process "
                        f"({whose}) has {have:g}: close() that trainer, or let its train() return, first, or "
                        "start Ray yourself with enough CPUs (ray.init(num_cpus=...))", self.key)
                ray.shutdown()  # every job on it is idle: start it again with room for this one
        if not ray.is_initialized():
            if self.address is None and self.nodes > 1:
                raise ConfigError(f"{self.nodes} nodes need a Ray cluster: start one (`ray start --head` on one "
                                  "machine, `ray start --address HEAD:6379` on the others) and set "
                                  "resources.ray_address=HEAD:6379", "resources.nodes")
            if self.address is not None:
                init_ray(address=self.address)
            else:
                # The ranks set their own thread counts; the CPU count only lets every rank be placed.
                init_ray(num_cpus=max(os.cpu_count() or 1, self.cpus))
            RayHold._started = True
        self.busy = busy

    def idle(self) -> None:
        """This job's workers are stopped (and their placement groups released)."""
        self.busy = False

    def close(self) -> None:
        """This job is done with Ray; the last hold stops the Ray a hold started."""
        self.busy = False
        if self in RayHold._holds:
            RayHold._holds.remove(self)
        if not RayHold._holds and RayHold._started:
            RayHold._started = False
            if ray.is_initialized():
                ray.shutdown()


# The start of the notice Ray's driver prints (as "(raylet) ...") when a worker process
# dies. It guesses "killed by the OOM killer due to high memory usage" for every death; the
# controller reports the same death in its own words (futures.to_worker_error: role, rank,
# node, pid, the call, what to check), so the guess only misleads.
_WORKER_DEATH_NOTICE = "A worker died or was killed while executing a task"


def _drop_worker_death_notices() -> None:
    """Make this driver skip Ray's worker-death notice (everything else Ray prints stays).

    Ray prints the cluster's error messages from a thread that calls
    `ray._private.worker.print_to_stdstream`; wrapped once per process. A Ray without that
    function (a future version) keeps printing its notice: nothing else changes.
    """
    from ray._private import worker as ray_worker

    printer = getattr(ray_worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "_hybridflow_filtered", False):
        return

    def print_to_stdstream(data: dict, *args: object, **kwargs: object) -> None:
        if data.get("pid") == "raylet" and any(_WORKER_DEATH_NOTICE in line for line in data.get("lines", ())):
            return
        printer(data, *args, **kwargs)

    print_to_stdstream._hybridflow_filtered = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = print_to_stdstream


# Ray logs this at WARNING level on every start of a local instance, where it turns token
# authentication on by default. Nothing is wrong and nothing is asked of the user, but it
# reads like a problem (issue 26); the instance keeps its token authentication.
_TOKEN_AUTH_NOTICE = "Token authentication is enabled for this Ray cluster"


class _NoticeFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _TOKEN_AUTH_NOTICE not in record.getMessage()


def _drop_token_auth_notice() -> None:
    """Keep Ray's token-authentication-enabled notice off the console (once per process);
    its warning that authentication is *disabled* still shows."""
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _NoticeFilter) for f in logger.filters):
        logger.addFilter(_NoticeFilter())


def _token_auth_if_token_present() -> None:
    """Send Ray's token when this machine has one (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
    ~/.ray/auth_token) and RAY_AUTH_MODE is unset, as `ray start --head` and a plain
    `ray.init()` do; Ray 2.60 does not when given an explicit address, so joining a cluster
    that checks tokens failed with InvalidAuthToken (docs/resilience.md, "Multi-node"). A
    cluster without token authentication ignores the token. A Ray without this function
    (another version) is left to its own rule."""
    try:
        from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
    except ImportError:
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def describe_ray(embedded: bool | None = None) -> RayRuntime:
    """The running instance: GCS address, whether it is local-only, alive node count."""
    context = ray.get_runtime_context()
    gcs = context.gcs_address
    nodes = [node for node in ray.nodes() if node["Alive"]]
    if embedded is None:
        embedded = gcs.startswith(LOOPBACK + ":")
    return RayRuntime(address=gcs, embedded=embedded, num_nodes=len(nodes))


@contextlib.contextmanager
def _loopback_node_ip() -> Iterator[None]:
    # Ray deliberately turns 127.0.0.1 into the machine's routable IP so that other nodes
    # can join, and then binds its services on all interfaces. An embedded instance has no
    # other nodes, so we switch off Ray's cluster-address lookup while it starts: GCS,
    # raylet and workers then bind to 127.0.0.1 only. This flag is read at call time; when a
    # future Ray drops it, the instance still starts, only bound more widely.
    from ray._private import ray_constants

    saved = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if saved is None:
        yield
        return
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def _driver_pythonpath() -> str:
    # Worker classes often live in modules the controller imported from its own path
    # (a script's folder, a test folder). Workers of the embedded instance run on this
    # machine, so they get the same user folders; installed packages are found anyway.
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    folders = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if os.path.isdir(path) and not any(path.startswith(p + os.sep) or path == p for p in prefixes):
            folders.append(path)
    existing = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(dict.fromkeys(folders + ([existing] if existing else [])))
