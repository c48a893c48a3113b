"""The sections of the run config tree (`RunConfig`, hybridflow/config/schema.py), one module per
section; each setting is defined once, in its section's class.

- async_rl.py: Settings of the asynchronous trainer modes (`trainer.mode` one_step_off / async,
  docs/async.md).
- data.py: The `data` section: RL prompt files or the built-in arithmetic task, and the batch size.
- model.py: The `model` section: the policy model (a local directory, a pretrained model, or the
  built-in tiny one).
- resources.py: The `resources` section: ranks, threads, machines and where the roles run
  (`ComputeSection` is the part every job shares, `ResourceSection` adds RL placement and elastic
  sizes).
- rewards.py: The `reward`, `reward_model` and `cost_model` sections: rule-based rewards and learned
  scorers.
- roles.py: The `actor` and `critic` sections: the training engine's settings of each trained role
  plus its loss.
- sft.py: The `sft` section: the supervised warm start (`hybridflow sft`, and before RL when
  sft.steps > 0).
- trainer.py: The `trainer` section of the run config: how long, how often to evaluate and save,
  where the run goes, what it logs, the mode and the restart policy.
"""
