"""`LanguageModelTask`: the RL loop on the controller for language-model post-training, what
`RLTrainer` (entry.py) runs for a config of that task kind.

    from hybridflow import RLTrainer

    with RLTrainer("examples/grpo_arithmetic.yaml") as trainer:   # builds a LanguageModelTask
        result = trainer.train(steps=5)          # SFT warm start (sft.steps > 0) first, once
    print(result.accuracy_before, result.accuracy_after, result.run_dir)

`train` runs `steps` iterations of the configured algorithm (programs/algorithms.py) over batches
of prompts, then evaluates greedily on the held-out prompts and exports the policy. Each
step's metrics go to <run>/metrics.jsonl and the console. Every trainer.save_freq steps the
whole loop state is checkpointed (run/checkpointing.py), and

    RLTrainer(resume="runs/<run>").train()   # continues that run to trainer.total_steps

continues from the newest complete checkpoint in the same run directory, with the metrics
an uninterrupted run would have logged. When a worker fails mid-run (its process or node
dies, it raises, or a call outlives trainer.call_timeout_s), `train` does the same by
itself, up to trainer.max_restarts times (run/recovery.py). <run>/status.json tells
`hybridflow monitor` what the run is doing (observe/live_status.py).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from hybridflow.config import ConfigError
from hybridflow.config.model_presets import write_model_presets
from hybridflow.config.schema import RunConfig
from hybridflow.controller import FETCHED, WorkerError, WorkerGroup, network
from hybridflow.data import ResumableLoader
from hybridflow.trainer.programs.algorithms import build_algo_state, step_program
from hybridflow.trainer.modes.async_trainer import AsyncRunner
from hybridflow.trainer.run.checkpointing import (
    CHECKPOINTS_DIR,
    begin_checkpoint,
    checkpoint_step,
    commit_checkpoint,
    complete_checkpoints,
    controller_rng_state,
    logged_accuracy,
    read_trainer_state,
    role_checkpoint_path,
    set_controller_rng_state,
)
from hybridflow.trainer.run.elastic import restart_config
from hybridflow.trainer.lm.evaluate import evaluate
from hybridflow.trainer.run.lifecycle import (
    MODEL_KEY,
    ResumePoint,
    check_steps_left,
    model_record,
    policy_start_path,
    resume_point,
)
from hybridflow.trainer.observe.live_status import LiveStatus
from hybridflow.trainer.observe.metrics import BatchSummary, flop_model, mfu_note, throughput_metrics
from hybridflow.trainer.programs.phases import Roles, Step
from hybridflow.trainer.run.stop_signal import STOP, RunTerminated, stopped_line
from hybridflow.trainer.run.preflight import check_lengths_fit
from hybridflow.trainer.observe.plots import plot_run
from hybridflow.trainer.run.recovery import RESTART_PHASE, CannotRestart, Failure, supervise
from hybridflow.trainer.run.run_dir import discard_unused_run_dir
from hybridflow.trainer.run.setup import (
    RunContext,
    build_cost_manager,
    build_groups,
    endless,
    rank_cpus,
    rl_roles,
    train_prompts,
)
from hybridflow.trainer.jobs.sft import run_sft
from hybridflow.trainer.observe.signal import SignalWatch
from hybridflow.workers import shutdown_role_groups


@dataclass
class TrainResult:
    """What a `train` call achieved (accuracies are greedy held-out; None without val data)."""

    run_dir: Path
    steps: int
    accuracy_before: float | None
    accuracy_after: float | None
    last_metrics: dict[str, float]
    stopped: str | None = None  # why the run stopped before its steps were done (observe/signal.py), None if it did not


class LanguageModelTask:
    """Validates the config and creates the run directory at construction; starts the
    workers on the first `train` call. `release` stops them (after a checkpoint), `close`
    ends the run."""

    def __init__(self, config: RunConfig | None = None,
                 resume: str | Path | bool | ResumePoint | None = None) -> None:
        """`config`: a RunConfig (RLTrainer builds it from a dict or a YAML file).

        `resume`: continue a run from a checkpoint in its own run directory: what
        lifecycle.resume_point takes (a run or checkpoint directory, True, a SavedRun) with
        `config`, or a ResumePoint it worked out.
        """
        self.resumed_from: Path | None = None  # the checkpoint this trainer started from
        self.global_step = 0
        if isinstance(resume, ResumePoint) and config is not None:
            raise ValueError("a ResumePoint carries its config; pass config=None with it")
        resume_from = None
        if resume is not None:
            point = resume if isinstance(resume, ResumePoint) else resume_point(resume, config)
            self.resumed_from, config, self.global_step = point.checkpoint, point.cfg, point.step
            resume_from = point.saved  # its config.yaml is not read again
        self.ctx = RunContext.open(config, resume_from=resume_from)
        STOP.install()  # after Ray's own SIGTERM handler (RunContext.open started Ray), which aborts
        self.config = self.ctx.cfg  # resolved: as saved in <run>/config.yaml
        self.run_dir = self.ctx.run_dir
        self.status = LiveStatus(self.run_dir)
        if self.resumed_from is not None:
            self.ctx.display.message(f"resuming from {self.resumed_from} (step {self.global_step})")
        self.groups: dict[str, WorkerGroup] = {}
        self.roles: Roles | None = None
        self.async_runner: AsyncRunner | None = None  # trainer.mode one_step_off / async
        self.sft_result = None
        self.released_at: Path | None = None  # the checkpoint `release` wrote, which the next start loads
        self.signal = SignalWatch(self.config.trainer.max_no_signal_steps, self.ctx.display.message)
        self.stopped: str | None = None

    def release(self, save: bool) -> None:
        """Stop the workers and release their placement groups (the reward processes and the
        run directory stay; Ray too, though a later trainer needing more CPUs may restart
        it: controller RayHold); with `save`, checkpoint the current step first (unless
        it is saved already), so the next `train` continues from it as `--resume` would."""
        if self.roles is None:
            return
        state = self.status.data["state"]  # how train() ended (its checkpoint here is no new phase of it)
        newest = complete_checkpoints(self.run_dir / CHECKPOINTS_DIR)
        if save and self.global_step > 0:
            self.released_at = (newest[-1] if newest and checkpoint_step(newest[-1]) == self.global_step
                                else self.save_checkpoint())
            self.resumed_from = self.released_at
        elif newest:  # a failed call: the next start goes back to the newest complete checkpoint
            self.released_at = self.resumed_from = newest[-1]
            self.global_step = checkpoint_step(newest[-1])
        shutdown_role_groups(self.groups)
        self.ctx.ray.idle()
        self.status.update(state=state, phase=None)
        self.groups, self.roles, self.async_runner = {}, None, None

    def close(self) -> None:
        """Stop the workers, the reward processes and (if this run started it) Ray."""
        shutdown_role_groups(self.groups)
        self.groups = {}
        self.status.close()
        self.ctx.close()
        if self.resumed_from is None and self.global_step == 0:
            discard_unused_run_dir(self.run_dir)  # a start that failed leaves no empty run dir

    # ------------------------------------------------------------------ setup

    def setup(self) -> float:
        """Start the workers and the SFT warm start, when configured (RLTrainer.setup)."""
        if self.roles is not None:
            return 0.0
        tick = time.perf_counter()
        self._start()
        return time.perf_counter() - tick

    def _start(self) -> None:
        cfg, ctx = self.config, self.ctx
        ctx.ray.use()  # Ray up with room for the ranks (another trainer may have restarted it)
        data = train_prompts(cfg, ctx.tokenizer)  # before any worker starts: lengths are checked now
        check_lengths_fit(cfg, max(map(len, data.input_ids)), "the longest training prompt")
        sft_actor = None
        if cfg.sft.steps > 0 and self.resumed_from is None:  # a resumed run warm-started before its checkpoint
            self.sft_result = run_sft(ctx, keep_actor=True)
            sft_actor, self.sft_result.actor = self.sft_result.actor, None
            ctx.display.message(f"SFT warm start: {cfg.sft.steps} steps, loss {self.sft_result.final_loss:.3f}")
        self.groups, policy_path = self._role_groups(sft_actor)
        if ctx.cost is None:
            ctx.cost = build_cost_manager(cfg, ctx.tokenizer)  # closed with the context
        g = self.groups
        self.roles = Roles(actor=g["actor"], critic=g.get("critic"), reward=ctx.reward,
                           reward_model=g.get("reward_model"), cost_critic=g.get("cost_critic"),
                           cost_model=g.get("cost_model"), cost_fn=ctx.cost)
        self.loader = ResumableLoader(data, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.seed,
                                      collate_fn=data.collate)
        self.batches = endless(self.loader)
        self.state = build_algo_state(cfg)
        self.flop_model = flop_model(self.groups)  # each rank measures its own device's peak
        if cfg.trainer.mode != "sync":  # a generation-only pool beside the actor (modes/async_trainer.py)
            self.async_runner, self.groups["rollout"] = AsyncRunner.start(
                cfg, self.roles, policy_path, self.batches, self.state, rank_cpus(cfg.resources, ctx.layout))
        self.status.workers(self.groups)  # the rollout pool's processes too
        for line in network.unreported([i for group in self.groups.values() for i in group.worker_info]):
            ctx.display.message(line)  # where the collectives of a multi-node run bind (controller/network.py)
        note = mfu_note(self.flop_model.peak_flops, cfg.resources.use_gpu, cfg.actor.peak_flops_per_device is not None)
        if note is not None:
            ctx.display.message(note)
        if self.resumed_from is not None:
            self._load_checkpoint(self.resumed_from)

    def _role_groups(self, sft_actor: WorkerGroup | None) -> tuple[dict[str, WorkerGroup], Path]:
        """The RL roles' worker groups and the model the policy starts from. An actor alone
        is built again in the SFT warm start's processes (no new workers); otherwise those
        are stopped and every role starts."""
        sft = {"actor": sft_actor} if sft_actor is not None else {}
        try:
            policy_path = policy_start_path(self.config, self.run_dir)
            roles = rl_roles(self.config, policy_path)
        except BaseException:
            shutdown_role_groups(sft)
            raise
        if sft and list(roles) == ["actor"]:
            sft_actor.rebuild(*roles["actor"].args)
            return sft, policy_path  # closed with self.groups from here on
        shutdown_role_groups(sft)
        return build_groups(self.config, self.ctx.layout, roles), policy_path

    # ------------------------------------------------------------------ loop

    def train(self, steps: int | None = None) -> TrainResult:
        """Run `steps` more RL steps (default: until trainer.total_steps), evaluating before
        and after."""
        cfg = self.config
        if steps is None:  # RLTrainer.train checked a given one (as_steps)
            steps = check_steps_left(self.global_step, cfg.trainer.total_steps)
        self.setup()
        before = self._accuracy_before()
        end = self.global_step + steps
        try:
            with STOP.deferred():  # a SIGTERM lets the step in progress finish (run/stop_signal.py)
                metrics = supervise(lambda: self._run_steps(end, steps), self._restart, self._failure,
                                    cfg.trainer.max_restarts, report=lambda text: self.ctx.display.message(text))
        except BaseException:
            self.status.update(state="stopped" if STOP.received else "failed")
            raise
        self.status.update(state="finished", phase=None)
        after = self._held_out_accuracy()
        if self.config.trainer.save_final_model:
            self.roles.actor.export_hf(str(self.run_dir / "final_model"))
            write_model_presets(self.run_dir / "final_model", self.config,
                                f"run {self.run_dir} after RL step {self.global_step}")
        result = TrainResult(self.run_dir, self.global_step, before, after, metrics, self.stopped)
        if "jsonl" in self.config.trainer.loggers:  # the plots of the run so far, from metrics.jsonl
            plot_run(self.run_dir)
        self._report(result)
        return result

    def _run_steps(self, end: int, steps: int) -> dict[str, float]:
        """RL steps until global step `end` (the last `steps` of them are this train call's);
        the last step's metrics."""
        cfg, ctx = self.config, self.ctx
        algorithm = step_program(cfg.algorithm.spec)
        ctx.display.start(cfg.algorithm.name.upper(), steps)
        metrics: dict[str, float] = {}
        while self.global_step < end:
            self.global_step += 1
            done = steps - (end - self.global_step)
            self.status.update(step=self.global_step)
            start, fetched = time.perf_counter(), dataclasses.replace(FETCHED)
            if self.async_runner is not None:
                step = self.async_runner.step(self.global_step, self.status.phase)
            else:
                step = Step(self.global_step, next(self.batches), more_prompts=lambda: next(self.batches),
                            balance_dp=cfg.trainer.balance_batch, concurrent=cfg.trainer.concurrent_phases,
                            on_phase=self.status.phase)
                algorithm(step, self.roles, cfg, self.state)
            step.metrics["timing_s/step"] = time.perf_counter() - start
            # What the controller fetched from the workers during the step (controller/futures.py).
            step.metrics["controller/fetched_tensor_bytes"] = float(FETCHED.tensor_bytes - fetched.tensor_bytes)
            step.metrics["controller/fetched_values"] = float(FETCHED.values - fetched.values)
            metrics = self._step_metrics(step)
            self.stopped = self.signal.stop_reason(self.global_step, metrics)
            if self._due(cfg.trainer.test_freq) and done < steps:  # the last step is evaluated below
                metrics.update(self._val_metrics())
            ctx.log.write("rl", self.global_step, metrics)
            if self._due(cfg.trainer.save_freq):  # after the log: a checkpoint's steps are all logged
                self.save_checkpoint()
            self.status.update(steps_done=self.status.data["steps_done"] + 1)
            ctx.display.step(done, steps, metrics)
            if STOP.received:
                ctx.display.stop()
                raise RunTerminated(stopped_line(self.global_step, self._checkpoint_on_signal(), self.run_dir))
            if self.stopped is not None:
                ctx.display.message(f"step {self.global_step}: {self.stopped}")
                break
        ctx.display.stop()
        return metrics

    def _failure(self, err: WorkerError) -> Failure:
        if self.async_runner is not None and not err.died:  # failed anywhere in the loop, e.g. the checkpoint
            err = self.async_runner.root_cause(err)
        return Failure.of(err, self.global_step, self.status.current_phase)

    def _restart(self, failure: Failure, restarts: int) -> None:
        """Tear every worker group down (hung processes are killed), then continue from the
        newest complete checkpoint as `--resume` would (run/recovery.py), on the world size the
        cluster holds now when the run is elastic (run/elastic.py)."""
        group = self.groups.get(failure.role) if failure.cause == "died" else None  # a dead rank's group
        lost_node = group.worker_info[failure.rank]["node_id"] if group is not None else None  # its Ray node
        shutdown_role_groups(self.groups)
        self.groups, self.roles = {}, None
        checkpoints = complete_checkpoints(self.run_dir / CHECKPOINTS_DIR)
        if not checkpoints:
            raise CannotRestart(f"the run has no complete checkpoint to go back to (trainer.save_freq="
                                f"{self.config.trainer.save_freq}); set trainer.save_freq to checkpoint every N steps")
        self.status.update(state="restarting", restarts=restarts)
        before = self.config.resources
        try:
            cfg = restart_config(self.config, lost_node)
        except ConfigError as err:
            raise CannotRestart(str(err)) from err
        self.ctx = self.ctx.reopen(checkpoints[-1], cfg)
        self.config = self.ctx.cfg
        self.resumed_from, self.global_step = checkpoints[-1], checkpoint_step(checkpoints[-1])
        after = self.config.resources
        resized = "" if after == before else (f"; world size {before.world_size} on {before.nodes} node(s) -> "
                                              f"{after.world_size} on {after.nodes}")
        self.ctx.display.message(f"restart {restarts}: resuming from {self.resumed_from} (step {self.global_step})"
                                 + resized)
        self._start()
        self.ctx.log.write(RESTART_PHASE, self.global_step, {
            **failure.record(restarts, self.global_step), "restart/world_size": after.world_size,
            "restart/nodes": after.nodes, "restart/previous_world_size": before.world_size,
            "restart/previous_nodes": before.nodes})

    def _step_metrics(self, step: Step) -> dict[str, float]:
        cfg = self.config
        metrics = dict(step.metrics)
        summary = step.summary if step.summary is not None else BatchSummary.of(step.batch)
        metrics.update(summary.metrics)
        # Every role over the trained batch, each at its own size (metrics.flop_model). Not
        # counted: ReMax's greedy generation and the groups DAPO generated and dropped.
        flops = self.flop_model.step_flops(
            summary.seq_lens, actor_forwards=1 + int(cfg.use_reference), actor_update_epochs=cfg.actor.micro_batch.epochs,
            critic_update_epochs=cfg.critic.micro_batch.epochs,
        )
        metrics.update(throughput_metrics(sum(summary.seq_lens), metrics["timing_s/step"], flops,
                                          self.flop_model.peak_flops))
        return metrics

    def _checkpoint_on_signal(self) -> Path | None:
        """The checkpoint a run stopped by SIGTERM leaves: this step's (written now with
        trainer.save_on_signal, unless save_freq just wrote it), else the newest there is."""
        cfg = self.config.trainer
        if cfg.save_on_signal and not self._due(cfg.save_freq):
            return self.save_checkpoint()
        found = complete_checkpoints(self.run_dir / CHECKPOINTS_DIR)
        return found[-1] if found else None

    def _due(self, freq: int) -> bool:
        return freq > 0 and self.global_step % freq == 0

    def _val_metrics(self) -> dict[str, float]:
        """Greedy held-out metrics of the current policy (empty without held-out prompts)."""
        ctx = self.ctx
        if ctx.val_batch is None:
            return {}
        start = time.perf_counter()
        metrics = evaluate(self.roles.actor, ctx.val_batch, ctx.reward, ctx.layout.rollout_groups,
                           self.config.trainer.validation)
        metrics["timing_s/eval"] = time.perf_counter() - start
        return metrics

    def _held_out_accuracy(self) -> float | None:
        """Evaluate and log (phase "eval": the loggers print and store it); the accuracy,
        or None without held-out prompts."""
        metrics = self._val_metrics()
        if not metrics:
            return None
        self.ctx.log.write("eval", self.global_step, metrics)
        return metrics["val/accuracy"]

    def save_checkpoint(self) -> Path:
        """Checkpoint the current step into <run>/checkpoints/global_step_<N> (every role's
        engine and worker state, the data position, the algorithm state, the controller's
        RNG), atomically, then keep the newest trainer.keep_last_checkpoints."""
        self.status.phase("save_checkpoint")
        tmp = begin_checkpoint(self.run_dir, self.global_step)
        trained = self._trained_groups()
        for name, group in trained.items():
            group.write_checkpoint(str(tmp / name))
        state = {"global_step": self.global_step, "roles": sorted(trained),
                 "algorithm": self.state.state_dict(), "loader": self.loader.state_dict(),
                 "rng": controller_rng_state(), MODEL_KEY: model_record(self.config, self.ctx.model_path)}
        if self.async_runner is not None:  # version, seeds' call count, untrained prompts (modes/async_trainer.py)
            state["async"] = self.async_runner.save_state(tmp)
        return commit_checkpoint(tmp, state, self.config.trainer.keep_last_checkpoints)

    def _load_checkpoint(self, checkpoint: Path) -> None:
        """Restore what `save_checkpoint` wrote (after the workers, loader and state exist)."""
        state = read_trainer_state(checkpoint)
        trained = self._trained_groups()
        if sorted(state["roles"]) != sorted(trained):
            raise ValueError(f"checkpoint {str(checkpoint)!r} holds roles {state['roles']}, this run trains "
                             f"{sorted(trained)}; resume with the algorithm the checkpoint was written with")
        for name, group in trained.items():
            group.load_checkpoint(str(role_checkpoint_path(checkpoint, name)))
        self.loader.load_state_dict(state["loader"])
        self.state.load_state_dict(state["algorithm"])
        if self.async_runner is not None:
            self.async_runner.load_state(state["async"], checkpoint)
        set_controller_rng_state(state["rng"])  # last: building the workers drew from it

    def _trained_groups(self) -> dict[str, WorkerGroup]:
        # The roles RL trains; frozen scorers (reward_model, cost_model) are loaded from
        # their paths again on resume.
        trained = self.config.algorithm.spec.trained_roles
        return {name: group for name, group in self.groups.items() if name in trained}

    def _accuracy_before(self) -> float | None:
        """The held-out accuracy at the start of this `train` call; right after a resume,
        the run's own step-0 evaluation from metrics.jsonl (not evaluated again)."""
        if (self.resumed_from is not None and self.resumed_from != self.released_at
                and self.global_step == checkpoint_step(self.resumed_from)):
            return logged_accuracy(self.run_dir, step=0)
        return self._held_out_accuracy() if self.config.trainer.val_before_train else None

    def _report(self, result: TrainResult) -> None:
        display, trainer = self.ctx.display, self.config.trainer
        if result.accuracy_before is not None and result.accuracy_after is not None:
            gain = 100 * (result.accuracy_after - result.accuracy_before)
            how = "sampled" if trainer.validation.do_sample else "greedy"
            display.message(
                f"[bold]held-out accuracy ({how}): {result.accuracy_before:.1%} before RL -> "
                f"{result.accuracy_after:.1%} after RL ({gain:+.1f} points)[/bold]"
            )
        saved = [name for name, present in (
            ("config.yaml", True), ("metrics.jsonl", "jsonl" in trainer.loggers), ("plots/", "jsonl" in trainer.loggers),
            ("tensorboard/", "tensorboard" in trainer.loggers), ("final_model/", trainer.save_final_model),
        ) if present]
        display.message(f"run saved to [bold]{result.run_dir}[/bold] ({', '.join(saved)})")
