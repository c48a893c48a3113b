"""Weight sync and one one_step_off RL step between two machines (network namespaces with Ray
started as docs/resilience.md says, tests/cluster/netns.py) against the planner's prediction
for the link's bandwidth; links: the bridge, RATE Mbit/s (tc tbf), and RATE plus DELAY ms
each way (no sch_netem in this kernel: a userspace forwarder, tests/cluster/delay_link.py).
Sync: cluster_sync_probe.py's WeightBridge, head -> other node. Step: GRPO, 2 training ranks
on the head, the rollout pool on the other node. Needs root. Method: docs/resilience.md.

    sudo .venv/bin/python benchmarks/controller/bench_cluster_link.py \\
        --out benchmarks/controller/results/cluster_link.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks.common.plain_machine import load_average, machine  # noqa: E402
from benchmarks.common.provenance import stamp  # noqa: E402
from hybridflow.config.loader import load_config  # noqa: E402
from hybridflow.config.schema import RunConfig  # noqa: E402
from hybridflow.planner.overlap import (  # noqa: E402
    Lengths,
    batch_length,
    bytes_between_pools_s,
    generate_s,
    overlapped_step,
    train_s,
)
from hybridflow.planner.problem import Cluster, problem_from_config  # noqa: E402
from tests.cluster.netns import NetnsCluster, unavailable  # noqa: E402

STEP_RUN = ["algorithm.name=grpo", "trainer.mode=one_step_off", "async_rl.rollout_ranks=1", "resources.nodes=1",
            "resources.ranks_per_node=2", "trainer.console=none", "trainer.test_freq=0",
            "trainer.save_final_model=false", "sft.steps=0", "trainer.val_before_train=false",
            "data.train_batch_size=4", "rollout.n=2", "actor.micro_batch.mini_batch_size=4",
            "actor.micro_batch.micro_batch_size_per_device=2", "reward.manager.num_workers=1"]


def links(cluster: NetnsCluster, rate_mbit: float, delay_ms: float) -> list[tuple[str, float | None, object]]:
    """(label, bandwidth in bytes/s or None for the unlimited bridge, context manager)."""
    return [("bridge", None, contextlib.nullcontext()),
            (f"{rate_mbit:g}mbit", rate_mbit * 1e6 / 8, lambda: cluster.rate_limited(1, rate_mbit)),
            (f"{rate_mbit:g}mbit+{delay_ms:g}ms", rate_mbit * 1e6 / 8, lambda: cluster.slowed(1, delay_ms, rate_mbit))]


def enter(link: object) -> contextlib.AbstractContextManager:
    return link() if callable(link) else link


def measure_syncs(cluster: NetnsCluster, conditions, sizes: list[int], repeats: int) -> dict[str, dict]:
    probe = cluster.popen(0, [sys.executable, str(REPO / "benchmarks" / "controller" / "cluster_sync_probe.py"), cluster.address,
                              ",".join(map(str, sizes)), str(repeats)], cwd=REPO, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
    out: dict[str, dict] = {}
    try:
        assert probe.stdout is not None and probe.stdin is not None
        while (line := probe.stdout.readline()) and line.strip() != "READY":
            pass
        for label, _, link in conditions:
            with enter(link):
                probe.stdin.write(label + "\n")
                probe.stdin.flush()
                while not (line := probe.stdout.readline()).startswith("RESULT "):
                    if not line:
                        raise RuntimeError("the sync probe ended early")
                out[label] = json.loads(line.removeprefix("RESULT "))["sizes"]
                print(f"  sync {label}: " + ", ".join(f"{m} MiB {r['median_s']:.3f} s" for m, r in out[label].items()),
                      flush=True)
    finally:
        probe.stdin.close()
        probe.wait(timeout=120)
    return out


def measure_step(cluster: NetnsCluster, label: str, link: object, steps: int, root: Path) -> dict:
    run_dir = root / f"step-{label}"
    with enter(link):
        done = cluster.run(0, [str(Path(sys.executable).parent / "hybridflow"), "train", *STEP_RUN,
                               f"resources.ray_address={cluster.address}", f"trainer.total_steps={steps}",
                               f"trainer.run_dir={run_dir}"], cwd=REPO, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the {label} run failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("phase") == "rl"][1:]  # the first step starts the pipeline
    step_s = statistics.median(r["timing_s/step"] for r in rows)
    sync_s = statistics.median(r["weight_sync/seconds"] for r in rows)
    sync_bytes = rows[0]["weight_sync/bytes"]
    print(f"  step {label}: {step_s:.3f} s, weight sync {sync_s:.3f} s ({sync_bytes / 1e6:.2f} MB)", flush=True)
    return {"step_s": step_s, "weight_sync_s": sync_s, "weight_sync_bytes": sync_bytes, "steps_counted": len(rows),
            "run_dir": run_dir}


def round_trip_ms(cluster: NetnsCluster, link: object) -> float:
    with enter(link):
        return cluster.round_trip_ms(1)


def netem_refusal(cluster: NetnsCluster) -> str:
    """What `tc qdisc add ... netem` says on this kernel (empty when it works: then it is removed)."""
    add = ["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "50ms"]
    done = cluster.run(1, add, timeout=60)
    if done.returncode == 0:
        cluster.run(1, ["tc", "qdisc", "del", "dev", "lo", "root"], timeout=60)
        return ""
    return f"`{' '.join(add)}` -> rc {done.returncode}: {done.stderr.strip()}"


def link_cluster(nodes: int, per_node: int, bandwidth: float | None) -> Cluster:
    """The planner's CPU cluster whose inter-node bandwidth is the link's (None: its own figure)."""
    cluster = Cluster.of(nodes, per_node, "cpu")
    if bandwidth is None:
        return cluster
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, inter_bw=bandwidth))


def predicted_sync_s(nbytes: float, bandwidth: float | None) -> float:
    """The planner's weight sync (planner/overlap.py) of `nbytes` between two one-device pools
    on two nodes joined by a link of `bandwidth` bytes/s."""
    return bytes_between_pools_s(nbytes, 2, link_cluster(2, 1, bandwidth))


def predicted_step_s(run_dir: Path, sync_bytes: float, bandwidth: float | None) -> dict[str, float]:
    """The planner's one_step_off step of the measured run (its config.yaml, its measured prompt
    and response lengths): generation on one device, training on the head's two (one node),
    the weight sync over the link, overlapped as planner/overlap.py does."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("phase") == "rl"]
    cfg = load_config(RunConfig, run_dir / "config.yaml")
    problem = problem_from_config(cfg, link_cluster(1, 2, bandwidth))
    work = dataclasses.replace(problem.workload, prompt_len=round(statistics.mean(r["prompt_length/max"] for r in rows)),
                               response_len=round(statistics.mean(r["response_length/mean"] for r in rows)))
    problem = dataclasses.replace(problem, workload=work)
    lengths = Lengths(max(1, work.response_len), max(1, round(max(r["response_length/max"] for r in rows))))
    gen = generate_s(problem, 1, batch_length(problem, 1, 1, lengths), 1, in_place_reshard=False)
    train = train_s(problem, 2, lengths.mean, 1)
    sync = predicted_sync_s(sync_bytes, bandwidth)
    return {"generate_s": gen, "train_s": train, "sync_s": sync, "step_s": overlapped_step("one_step_off", gen, train, sync)}


def key_figures(rows: list[dict]) -> dict[str, str]:
    """The RL step and the largest sync on each link, measured / predicted seconds."""
    largest = max((r["what"] for r in rows if r["what"].startswith("weight sync ") and "MiB" in r["what"]),
                  key=lambda what: float(what.split()[2]))
    return {f"{r['what'].split(' (')[0]} {r['link']} s (measured/predicted)": f"{r['measured_s']:.3f}/{r['predicted_s']:.3f}"
            for r in rows if r["what"] in (largest, "one_step_off RL step (tiny model)")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate-mbit", type=float, default=100.0)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--sizes", default="1,8,32", help="weight-sync payloads, MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        sys.exit(f"bench_cluster_link: {reason}")
    sizes = [int(s) for s in args.sizes.split(",")]
    load_before = load_average()
    root = Path(tempfile.mkdtemp(prefix="hfbench-"))
    cluster = NetnsCluster(root / "cluster", nodes=2, cpus_per_node=2)
    try:
        cluster.start()
        conditions = links(cluster, args.rate_mbit, args.delay_ms)
        netem = netem_refusal(cluster)
        rtts = {label: round_trip_ms(cluster, link) for label, _, link in conditions}
        print("  round trip: " + ", ".join(f"{label} {ms:.2f} ms" for label, ms in rtts.items()), flush=True)
        syncs = measure_syncs(cluster, conditions, sizes, args.repeats)
        steps = {label: measure_step(cluster, label, link, args.steps, root) for label, _, link in conditions}
    finally:
        cluster.close()
    rows = []
    for label, bandwidth, _ in conditions:
        for mib, got in syncs[label].items():
            rows.append({"what": f"weight sync {mib} MiB", "link": label, "measured_s": got["median_s"],
                         "predicted_s": predicted_sync_s(got["bytes"], bandwidth)})
        step = steps[label]
        rows.append({"what": "one_step_off weight sync (tiny model)", "link": label,
                     "measured_s": step["weight_sync_s"],
                     "predicted_s": predicted_sync_s(step["weight_sync_bytes"], bandwidth)})
        step["predicted"] = predicted_step_s(step.pop("run_dir"), step["weight_sync_bytes"], bandwidth)
        rows.append({"what": "one_step_off RL step (tiny model)", "link": label, "measured_s": step["step_s"],
                     "predicted_s": step["predicted"]["step_s"]})
    shutil.rmtree(root, ignore_errors=True)
    base = steps["bridge"]["step_s"]
    for row in rows:
        if row["predicted_s"]:
            row["measured_over_predicted"] = row["measured_s"] / row["predicted_s"]
        if row["what"].startswith("one_step_off RL step"):
            row["step_over_bridge"] = row["measured_s"] / base
    print(f"\n{'what':40s} {'link':18s} {'measured s':>11s} {'predicted s':>12s} {'meas/pred':>10s}")
    for row in rows:
        pred = f"{row['predicted_s']:.4f}" if row["predicted_s"] else "-"
        ratio = f"{row['measured_over_predicted']:.2f}" if "measured_over_predicted" in row else "-"
        print(f"{row['what']:40s} {row['link']:18s} {row['measured_s']:11.4f} {pred:>12s} {ratio:>10s}")
    emulated = {"bridge": "veth pairs on a Linux bridge, no limit",
                f"{args.rate_mbit:g}mbit": "tc tbf on both ends of the other node's veth (kernel), no added delay",
                f"{args.rate_mbit:g}mbit+{args.delay_ms:g}ms": "host routes through two tun devices joined by a "
                "userspace forwarder holding each packet delay ms (tests/cluster/delay_link.py), tc tbf on each tun"}
    report = {"settings": {"rate_mbit": args.rate_mbit, "delay_ms_each_way": args.delay_ms, "sizes_mib": sizes,
                           "repeats": args.repeats, "steps": args.steps, "step_run": STEP_RUN},
              "emulated": emulated, "netem": netem or "works", "round_trip_ms": rtts,
              "machine": machine(), "load_avg_before": load_before, "load_avg_after": load_average(),
              "when_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "rows": rows, "syncs": syncs, "steps": steps}
    report["key_figures"] = key_figures(rows)
    if args.out:
        args.out.write_text(json.dumps(stamp(report), indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
