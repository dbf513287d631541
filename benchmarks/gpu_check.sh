#!/usr/bin/env bash
# The learner on a GPU, in one prepared script (about 9 minutes on 16 CPUs and one GPU):
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]
#
# 0. tests/test_gpu_overlap.py: the update on a CUDA stream of its own and a round's pinned
#    copies, held to what the default stream gives (skipped on a machine without a GPU);
# 1. CartPole with learner.device=cuda to a 100-episode mean of 475 (benchmarks/cartpole_bar.py,
#    the quick start with that override, stopped at its crossing);
# 2. day4 without bullet_reacher (pybullet has no wheel for every Python), 7,000 envs for 90 s,
#    with the learner on the CPU and on cuda;
# 3. benchmarks/engine_sps.py at 7,000 CartPoles: random actions and PPO backlog=hold with the
#    learner on cuda, beside SyncVectorEnv and PufferLib's rows where pufferlib imports;
# 4. random actions again in groups of 70 (the layout of the figures of 2026-12-04);
# then one table (benchmarks/gpu_table.py) of what each step measured.
#
# On a machine where torch sees no GPU it says so and exits 0: nothing here is meant for the
# CPU. A machine without a package registry gets the wheels it lacks from
# benchmarks/gpu/fetch_wheels.sh (run where a registry is reachable) and runs this script
# through benchmarks/gpu/on_device.sh, which installs them and builds the Cython modules:
#
#   bash benchmarks/gpu/on_device.sh bash benchmarks/gpu_check.sh
#
# GPU_CHECK_STEPS="day4 engine" runs only the steps named (overlap, cartpole, day4, engine,
# layout), into the same OUT_DIR: the check split over two device calls, one table of it all.
# GPU_CHECK_DEVICE=cpu runs every step on the CPU at a small size (64 CartPoles, 1,000 envs
# for 20 s): the plumbing checked on a machine without a GPU, not a figure of anything.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
device=${GPU_CHECK_DEVICE:-cuda}

if [ "$device" = cuda ]; then
  if ! why=$("$PY" -c 'import torch, sys
ok = torch.cuda.is_available()
print(torch.cuda.get_device_name(0) if ok else f"torch {torch.__version__} sees no CUDA device")
sys.exit(0 if ok else 1)' 2>&1); then
    echo "gpu_check: no GPU here ($(echo "$why" | tail -1)); nothing to measure."
    exit 0
  fi
  out=${1:-$(mktemp -d /tmp/rlpipe-gpu-check.XXXXXX)}
  echo "gpu_check: $why, $(nproc) CPUs; results in $out"
  envs=7000 seconds=90 engine_s=40 cartpole_timeout=240
else
  out=${1:-$(mktemp -d /tmp/rlpipe-gpu-check.XXXXXX)}
  echo "gpu_check: GPU_CHECK_DEVICE=$device: the plumbing on the CPU at a small size; results in $out"
  envs=1000 seconds=20 engine_s=15 cartpole_timeout=300
fi
mkdir -p "$out"
steps=${GPU_CHECK_STEPS:-overlap cartpole day4 engine layout}
no_bullet=('~env@env_mix.types.bullet_reacher' '~env_mix.weights.bullet_reacher')

step() {  # step NAME TIMEOUT_S CMD...: the command's output in OUT/NAME.log, its status said
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout --kill-after=20 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "gpu_check: $name: exit $rc in $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || tail -5 "$out/$name.log" | sed 's/^/    /'
}

wanted() { [[ " $steps " == *" $1 "* ]]; }

wanted overlap && step overlap_tests 240 "$PY" -m pytest -q -p no:cacheprovider -o addopts= tests/test_gpu_overlap.py
wanted cartpole && step cartpole "$cartpole_timeout" "$PY" benchmarks/cartpole_bar.py --no-sb3 --variants-only \
  --seeds 1 --stop-at-475 --timeout "$((cartpole_timeout - 20))" --json --variant "$device=learner.device=$device"
for learner in cpu "$device"; do
  wanted day4 || break
  [ "$learner" = cpu ] && [ "$device" = cpu ] && [ -d "$out/day4_cpu" ] && continue
  step "day4_$learner" "$((seconds + 150))" "$PY" -m rlpipe +stage=day4 env_count="$envs" "${no_bullet[@]}" \
    run.duration_s="$seconds" learner.device="$learner" hydra.run.dir="$out/day4_$learner"
done
wanted engine && step engine_sps 330 "$PY" benchmarks/engine_sps.py --counts "$envs" --ppo-modes hold \
  --layouts auto --seconds "$engine_s" --sync-seconds 10 --async-counts --puffer-seconds 10 --json \
  learner.device="$device"
# random actions in groups of 70, one slice each: the layout of the figures of 2026-12-04, beside
# the auto layout's row above (since then auto gives random actions larger slices)
wanted layout && step engine_layout 150 "$PY" benchmarks/engine_sps.py --counts "$envs" --ppo-counts \
  --layouts 70 --seconds 20 --sync-seconds 5 --no-puffer --json
"$PY" benchmarks/gpu_table.py "$out" --device "$device"
