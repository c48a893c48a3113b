#!/bin/bash
# hybridflow's trainer on a lent GPU machine whose image has no Ray (docs: README "On a GPU").
# Ray's wheel (79 MB) is over the 64 MiB a device call carries, so `pack` builds, here, a 28 MB
# tar.xz of Ray without what the trainer never imports (Java, RLlib, Data, Serve, Train, Tune,
# the dashboard's web client) plus the wheels that image lacks; `run`, there, unpacks it and
# runs the default job, PPO with concurrent phases (fp32, bf16) and the user-algorithm example.
#
#   here:  bash benchmarks/gpu/gpu_trainer.sh pack          # writes .ray/ (git-ignored: /.ray/ in .git/info/exclude)
#   there: device run, carry [".ray"], timeout_s 400:  bash benchmarks/gpu/gpu_trainer.sh run [JOB ...]
# JOB is any of demo, ppo_concurrent, ppo_bf16, brevity (all when none is named), for a short lease.
set -u
case "${1:-}" in
pack)
  grep -qx "/.ray/" .git/info/exclude || echo "/.ray/" >> .git/info/exclude
  tmp=$(mktemp -d); mkdir -p .ray
  pip=("${PYTHON:-.venv/bin/python}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
       --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
  "${pip[@]}" -d "$tmp" ray==2.60.0 || exit 1
  "${pip[@]}" -d .ray jsonschema jsonschema-specifications referencing rpds-py gymnasium farama-notifications || exit 1
  (cd "$tmp" && unzip -q ray-*.whl && rm -rf ray/jars ray/rllib ray/data ray/serve ray/train ray/tune ray/llm \
     ray/dashboard/client/build && tar cf - ray ray-*.dist-info | xz -6 -T1) > .ray/ray.tar.xz || exit 1
  rm -rf "$tmp"; du -sh .ray ;;
run)
  mkdir -p /tmp/site && tar xJf .ray/ray.tar.xz -C /tmp/site && \
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .ray/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  python3 -c "import ray, torch, transformers; print('ray', ray.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
  shift; jobs=" ${*:-demo ppo_concurrent ppo_bf16 brevity} "
  one() {  # name, time limit (s), overrides...
    local name=$1 limit=$2; shift 2; local s; s=$(date +%s)
    [[ $jobs == *" $name "* ]] || return 0
    timeout "$limit" python3 -m hybridflow.cli train trainer.console=plain "trainer.run_dir=/tmp/runs/$name" "$@" \
      > "$OUT/$name.log" 2>&1
    echo "== $name rc=$? $(( $(date +%s) - s )) s"; grep -E "held-out accuracy|error|s/step" "$OUT/$name.log" | tail -4
  }
  one demo 170 resources.use_gpu=true
  one ppo_concurrent 90 resources.use_gpu=true algorithm.name=ppo trainer.total_steps=4 trainer.concurrent_phases=true sft.steps=50
  one ppo_bf16 120 resources.use_gpu=true algorithm.name=ppo trainer.total_steps=4 trainer.concurrent_phases=true sft.steps=50 \
    actor.dtype=bf16 rollout.dtype=bf16
  one brevity 120 --config examples/custom_algorithm/grpo_brevity.yaml resources.use_gpu=true resources.world_size=1 \
    trainer.total_steps=4 sft.steps=50 ;;
*) echo "usage: bash benchmarks/gpu/gpu_trainer.sh pack|run"; exit 2 ;;
esac
