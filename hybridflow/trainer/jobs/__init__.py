"""Jobs besides RL training: supervised fine-tuning (and its warm-start data), reward-model
training, eval / export of a saved policy, the calibration runs of `hybridflow plan`.

- builtin.py: Warm-start data of the built-in arithmetic task: answers from an imperfect teacher.
- offline.py: Scoring and exporting a saved policy outside a training run (`hybridflow eval`,
  `hybridflow export`).
- profiles.py: The real runs behind `hybridflow plan --calibrate`: each profile of
  hybridflow/planner/calibrate.py (a mapping of the built-in demo on 2 ranks) runs a few steps here;
  the phase times it logs are fitted into this machine's efficiency factors.
- rm.py: Reward-model training on preference pairs (`hybridflow rm`): its part of the one
  lifecycle (trainer/task.py), the Bradley-Terry loss on a trainable `RewardModelWorker` group.
- sft.py: Supervised fine-tuning on prompt/response pairs (`hybridflow sft`: its part of the one
  lifecycle; and the warm start before RL when sft.steps > 0).
"""
