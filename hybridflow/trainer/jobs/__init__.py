"""Jobs besides RL training: supervised fine-tuning (and its warm-start data), reward-model
training, eval / export of a saved policy, the calibration runs of `hybridflow plan`.
"""
