"""`RolloutWorker`: a generation-only role on its own pool (trainer.mode one_step_off / async;
the controller's side is trainer/modes/async_trainer.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
import torch
import torch.distributed as dist

from hybridflow.algorithms import dynamic_sampling_filter
from hybridflow.controller import Dispatch, Worker, WorkerGroup, register
from hybridflow.engines.models import load_hf_config
from hybridflow.engines.reshard.cross_pool import TensorMeta, TransferStats, WeightBridge
from hybridflow.engines.rollout import SamplingParams, build_rollout_engine
from hybridflow.engines.rollout.partial import POLICY_VERSION, StreamingRollout, oldest_version, split_groups
from hybridflow.envs.agent.loop import AgentLoop
from hybridflow.protocol import DataProto
from hybridflow.rewards.manager import sample_outcomes
from hybridflow.workers.common import require
from hybridflow.workers.config import ActorRolloutRefConfig
from hybridflow.workers.generation import (
    call_sampling_params,
    counts_as_sampled_call,
    rollout_engine_config,
    tokenizer_if_present,
)


# Where each rule-based scorer's results go in a scored group: its token-level scores' key and
# the prefix of its per-sample outcome columns (`sample_outcomes`); trainer/modes/stream_step.py
# reads them back as the program's scorers.
SCORED_COLUMNS = {"reward": ("token_level_scores", ""), "cost": ("token_level_costs", "cost:")}
# The uid suffix of ReMax's greedy response to a prompt while it is generated, and where it
# travels with its group (meta_info) to the program's greedy-baseline phase.
GREEDY_SUFFIX = "#greedy"
GREEDY_KEY = "greedy_response"


class RolloutWorker(Worker):
    """Generation only; weights from the training pool (see module docstring)."""

    bridge_timeout_s = 600.0  # how long a generation call waits for the weights it names

    def __init__(self, config: ActorRolloutRefConfig, reward_fn: Callable[[], Any] | None = None,
                 cost_fn: Callable[[], Any] | None = None, greedy_baseline: bool = False) -> None:
        """`reward_fn` builds the run's rule-based RewardManager (None: the groups leave
        unscored); `cost_fn` Safe-RLHF's rule-based cost function, scored the same way;
        `greedy_baseline` (ReMax): every prompt also gets one greedy response, scored and
        released with its group (needs `reward_fn`)."""
        if not isinstance(config, ActorRolloutRefConfig):
            raise TypeError(f"RolloutWorker needs an ActorRolloutRefConfig, got {type(config).__name__}")
        if greedy_baseline and reward_fn is None:
            raise ValueError("a greedy baseline is scored by the rule-based reward: pass reward_fn")
        self.config = config
        self.greedy_baseline = greedy_baseline
        # ReMax: finished groups waiting for their greedy response, and greedy responses waiting
        # for their group: uid -> (group or greedy response, its oldest version)
        self._held: dict[str, tuple[DataProto, int]] = {}
        self._greedy_held: dict[str, tuple[DataProto, int]] = {}
        # Their scoring processes exit with this one (rewards/pool.py), so nothing closes them.
        self.reward = reward_fn() if reward_fn is not None else None
        self.cost = cost_fn() if cost_fn is not None else None
        self.engine: Any = None  # the rollout engine (rollout.name)
        self.stream: StreamingRollout | None = None  # over the native engine: partial rollouts
        self.bridge: WeightBridge | None = None
        self.dp_rank = 0
        self.tp_rank = 0
        self.version = -1  # the version loaded into the engine; none yet
        self._generate_calls = 0
        # versions received by the background thread and not loaded yet: version -> (tensors, stats)
        self._staged: dict[int, tuple[list[tuple[str, torch.Tensor]], TransferStats]] = {}
        self._staged_cv = threading.Condition()
        self._receiver_error: BaseException | None = None

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the engine (collective: creates the tensor-parallel groups); weights come
        with the first generation call (or `load_version`)."""
        self.init_process_group()
        r = self.config.rollout
        tp = r.tensor_model_parallel_size
        if self.world_size % tp:
            raise ValueError(f"rollout.tensor_model_parallel_size={tp} does not divide the rollout pool's "
                             f"{self.world_size} ranks")
        groups = [dist.new_group(list(range(s, s + tp))) for s in range(0, self.world_size, tp)] if tp > 1 else None
        self.dp_rank, self.tp_rank = divmod(self.rank, tp)
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        trust = self.config.engine.trust_remote_code
        self.engine = engine = build_rollout_engine(
            r.name, load_hf_config(self.config.model_path, trust_remote_code=trust),
            rollout_engine_config(r, device, trust), process_group=groups[self.dp_rank] if groups else None,
            tokenizer=tokenizer_if_present(self.config.model_path, trust), model_path=self.config.model_path)
        # Partial rollouts need the native continuous-batching scheduler; other backends (and
        # multi-turn rollouts) generate whole calls (`_whole_call`).
        if r.name == "native" and not r.agent.enable:
            self.stream = StreamingRollout(engine, slots=r.max_num_seqs, max_len=engine.max_len)

    @register(dispatch=Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_bridge(self, host: str, port: int, world_size: int, manifest: list[TensorMeta],
                           bucket_bytes: int) -> None:
        """Join the actor's weight bridge as receiver 1 + rank (collective with the actor's
        join) and start receiving syncs in the background."""
        self.bridge = WeightBridge(host, port, 1 + self.rank, world_size, manifest, bucket_bytes)
        threading.Thread(target=self._receive_loop, name="weight-receiver", daemon=True).start()

    def _receive_loop(self) -> None:
        """The receiver thread: stage every sync the actor sends, until the bridge breaks
        (the actor's pool died or the run ended); the error is raised by the next call
        that waits for weights."""
        bridge = self.bridge
        assert bridge is not None
        try:
            while True:
                tensors: list[tuple[str, torch.Tensor]] = []
                stats = bridge.receive(tensors.extend)  # views into buckets of this sync: kept alive here
                with self._staged_cv:
                    self._staged[stats.version] = (tensors, stats)
                    self._staged_cv.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            with self._staged_cv:
                self._receiver_error = err
                self._staged_cv.notify_all()

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def load_version(self, version: int) -> dict[str, float]:
        """Wait until `version` is staged, load it and drop older staged versions; {} when
        the engine already holds it. Metrics under weight_sync/*. Generation calls load
        the version they name themselves; called alone, it loads without generating."""
        require(self.engine, "the rollout engine")
        if version == self.version:
            return {}
        if version < self.version:
            raise RuntimeError(f"generation asked for policy version {version}, the engine already holds {self.version}")
        with self._staged_cv:
            self._staged_cv.wait_for(lambda: version in self._staged or self._receiver_error is not None,
                                     timeout=self.bridge_timeout_s)
            if version not in self._staged:
                if self._receiver_error is not None:
                    raise RuntimeError(f"the weight bridge broke before version {version} arrived: "
                                       f"{self._receiver_error!r}") from self._receiver_error
                raise TimeoutError(f"policy version {version} did not arrive over the weight bridge in "
                                   f"{self.bridge_timeout_s} s")
            tensors, stats = self._staged.pop(version)
            for old in [v for v in self._staged if v < version]:
                del self._staged[old]
        in_flight = self.stream.in_flight if self.stream is not None else 0
        if self.stream is not None:
            self.stream.load_weights(tensors, version=version)
        else:
            self.engine.load_weights(tensors)
        self.version = version
        return {**stats.as_metrics("weight_sync/receive"), "weight_sync/in_flight": float(in_flight)}

    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)
    def generate_stream(self, prompts: DataProto | None, max_steps: int | None,
                        version: int) -> tuple[list[ray.ObjectRef], dict[str, Any]]:
        """Load policy `version` (waiting for it to arrive), add this rank's new prompts
        (None: none), run up to `max_steps` scheduler iterations (None: until everything
        queued is finished); return refs to the finished prompt groups (one DataProto per
        group in this node's object store, with policy_version and, with a reward function,
        their scores; [] on tensor-parallel ranks other than 0) and the steering record
        {"groups": [{uid, oldest_version, informative (scores differ: DAPO's filter)}],
        "metrics": weight_sync/* of the loaded sync ({} if none loaded) and reward/worker_restarts}."""
        require(self.engine, "the rollout engine")
        metrics = self.load_version(version)
        finished: list[DataProto] = []
        if prompts is not None and len(prompts):
            params = call_sampling_params(self.config.rollout, prompts.meta_info, self._generate_calls, self.dp_rank)
            if counts_as_sampled_call(params, prompts.meta_info):
                self._generate_calls += 1
            calls = [(prompts, params), *([self._greedy(prompts)] if self.greedy_baseline else [])]
            if self.stream is not None:
                for call in calls:
                    self.stream.add(*call)
            else:
                finished = [self._whole_call(*call) for call in calls]
        if self.stream is not None:
            self.stream.run(max_steps)
            finished = self.stream.pop_finished()
        if self.tp_rank != 0:
            return [], {"groups": [], "metrics": metrics}
        groups, steering, restarts = self._score_groups(finished)
        metrics.update(restarts)
        # Into this node's object store, owned by this process: the controller gets refs only.
        return [ray.put(group) for group in groups], {"groups": steering, "metrics": metrics}

    def _whole_call(self, prompts: DataProto, params: SamplingParams) -> DataProto:
        """Generate every response of `prompts` to its end under the loaded version (no
        partial rollouts: the call is never paused), so each token's version is the call's:
        a non-native backend's `generate`, or the multi-turn agent loop (rollout.agent.enable,
        envs/agent/loop.py, as the hybrid actor runs it). The loop's own metrics are dropped,
        as the hybrid actor drops them: the batch's agent/* metrics come from its multi-turn
        fields (rewards/manager.py `environment_metrics`)."""
        engine, r = self.engine, self.config.rollout
        if not r.agent.enable:
            out = engine.generate(prompts, params)
        else:
            if engine.tokenizer is None:
                raise RuntimeError(f"multi-turn rollouts need a tokenizer with a chat template in "
                                   f"{self.config.model_path}")
            response_length = int(prompts.meta_info.get("response_length", params.max_new_tokens))
            out = AgentLoop(engine, engine.tokenizer, r.agent, response_length, engine.pad_id).run(prompts, params)
        out.meta_info.pop("metrics", None)
        versions = torch.full_like(out.batch["responses"], self.version)
        out.batch[POLICY_VERSION] = versions.masked_fill(out.batch["response_mask"] == 0, -1)
        return out

    def _greedy(self, prompts: DataProto) -> tuple[DataProto, SamplingParams]:
        """ReMax: one greedy response per prompt, marked by its uid (it draws no seed)."""
        meta = {**prompts.meta_info, "do_sample": False, "n": 1}
        params = call_sampling_params(self.config.rollout, meta, self._generate_calls, self.dp_rank)
        uids = [f"{uid}{GREEDY_SUFFIX}" for uid in prompts.non_tensor_batch["uid"]]
        greedy = DataProto(batch=prompts.batch, non_tensor_batch={**prompts.non_tensor_batch,
                                                                   "uid": np.array(uids, dtype=object)}, meta_info=meta)
        return greedy, params

    def _pair_with_greedy(self, groups: list[DataProto],
                          steering: list[dict[str, Any]]) -> tuple[list[DataProto], list[dict[str, Any]]]:
        """ReMax: take the (scored) greedy responses out of `groups` and return the sampled
        groups whose greedy response is known, carrying it in meta_info[GREEDY_KEY] (under the
        group's uid: the program's greedy-baseline phase scores it), with their steering
        records; the others wait for theirs. A group's oldest version covers its greedy response too."""
        for group, info in zip(groups, steering):
            held = self._greedy_held if info["uid"].endswith(GREEDY_SUFFIX) else self._held
            held[info["uid"].removesuffix(GREEDY_SUFFIX)] = (group, info["oldest_version"])
        ready, records = [], []
        for uid in [u for u in self._held if u in self._greedy_held]:
            (group, version), (greedy, greedy_version) = self._held.pop(uid), self._greedy_held.pop(uid)
            greedy.non_tensor_batch["uid"] = np.full(len(greedy), uid, dtype=object)
            group.meta_info[GREEDY_KEY] = greedy
            ready.append(group)
            records.append({"uid": uid, "oldest_version": min(version, greedy_version), "informative": None})
        return ready, records

    def _score_groups(self, finished: list[DataProto]) -> tuple[list[DataProto], list[dict[str, Any]],
                                                                dict[str, float]]:
        """The finished prompt groups, scored by the rule-based reward and cost functions
        (those the run has), their steering records, and the scoring pools' worker restarts
        (reward/worker_restarts, cost/worker_restarts)."""
        groups, steering = [], []
        scorers = [(kind, fn) for kind, fn in (("cost", self.cost), ("reward", self.reward)) if fn is not None]
        restarts = {f"{kind}/worker_restarts": 0.0 for kind, _ in scorers}
        for batch in finished:
            for kind, fn in scorers:
                key, prefix = SCORED_COLUMNS[kind]
                out = fn.score(batch)
                batch.batch[key] = out.token_level_scores
                batch.non_tensor_batch.update({prefix + k: v for k, v in sample_outcomes(out).items()})
                restarts[f"{kind}/worker_restarts"] += out.metrics["reward/worker_restarts"]
            for group in split_groups(batch):
                uids = group.non_tensor_batch["uid"]
                informative = None if self.reward is None else bool(
                    dynamic_sampling_filter(uids, group.batch["token_level_scores"].sum(-1))[0][0])
                groups.append(group)
                steering.append({"uid": str(uids[0]), "oldest_version": oldest_version(group),
                                 "informative": informative})
        if self.greedy_baseline:
            groups, steering = self._pair_with_greedy(groups, steering)
        return groups, steering, restarts

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def restore_generate_calls(self, calls: int) -> None:
        """A resumed run: the sampling seeds continue from `calls` generation calls."""
        self._generate_calls = calls

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def staged_versions(self) -> list[int]:
        """Versions received and not loaded yet (for tests and debugging)."""
        with self._staged_cv:
            return sorted(self._staged)

    @register(dispatch=Dispatch.RANK_ZERO)
    def generation_weights(self) -> dict[str, torch.Tensor]:
        """Rank 0's generation weights by HF name, copied out in the engine's dtype (for
        checking a transfer; with tensor parallelism, rank 0's pieces)."""
        require(self.stream, "the rollout engine")
        return {name: view.detach().clone() for name, view in self.stream.engine.model.weights.views.items()}


def connect_weight_bridge(actor: WorkerGroup, rollout: WorkerGroup, bucket_bytes: int) -> None:
    """Create the WeightBridge between the actor's training rank 0 and every rollout rank."""
    host, port, manifest = actor.weight_bridge_endpoint()
    world = 1 + rollout.world_size
    joins = [actor.join_weight_bridge(host, port, world, manifest, bucket_bytes),
             rollout.join_weight_bridge(host, port, world, manifest, bucket_bytes)]
    for future in joins:
        future.get()
