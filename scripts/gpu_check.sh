#!/usr/bin/env bash
# Exercise the trainer's GPU path (trainer.device=cuda) on a machine with NVIDIA GPUs.
#
# Written on a machine without a GPU: nothing here has run on GPU hardware yet.
# Run it from the repository root on a box with CUDA torch and cadence installed:
#   bash scripts/gpu_check.sh            # everything that fits the GPUs it finds
#   STEPS=3 bash scripts/gpu_check.sh    # shorter `cadence train` runs
# It stops at the first failure (set -e) and ends with "gpu_check: all passed".
#
#  1. CUDA trainer vs CPU trainer: the same 3 steps (GRPO + KL + AsyPPO critics +
#     rhythm credit, pi_old recomputed) on the same tiny policy; losses close,
#     every module on cuda, weights() and state_dict() on CPU.
#  2. `cadence train trainer.device=cuda`, one GPU, the embedded engine (also with
#     trainer.bf16_autocast=true); then the vLLM engine if vllm imports (a GPU build).
#  3. With 2+ GPUs: data-parallel ranks over NCCL (runtime.trainer_workers=2, ddp
#     and fsdp): the DP-vs-one-rank tests of tests/test_dp_trainer.py (their
#     trainer.device is auto, so cuda here) and a 2-rank `cadence train`.
set -euo pipefail

STEPS="${STEPS:-4}"
PY="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checks import tests/ helpers
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

nvidia-smi -L
GPUS="$("$PY" -c 'import torch; assert torch.cuda.is_available(), "torch sees no CUDA GPU"; print(torch.cuda.device_count())')"
echo "gpu_check: torch sees $GPUS GPU(s)"

echo "== 1. one trainer on cuda vs on cpu, 3 steps"
"$PY" - <<'EOF'
import torch

from cadence.config import TrainerConfig
from tests.test_dp_trainer import make_groups
from tests.test_trainer_device import critic_credit_trainer

torch.set_num_threads(4)
runs = {}
for device in ("cpu", "cuda"):
    trainer = critic_credit_trainer(TrainerConfig(device=device, micro_batch_size=2, epochs=2, mini_batches=2))
    modules = [trainer.model, trainer.reference, trainer.credit.actor_attn.model, *trainer.critics.critics]
    assert all(p.device.type == device for m in modules for p in m.parameters()), f"a module is off {device}"
    runs[device] = [trainer.step(make_groups(s)) for s in range(3)]
    assert all(t.device.type == "cpu" for t in trainer.weights().values())
    opt = trainer.state_dict()["optimizer"]["state"]
    assert all(v.device.type == "cpu" for s in opt.values() for v in s.values() if torch.is_tensor(v))
for key in ("train/loss", "train/grad_norm", "critic/value_loss_0", "rhythm/gamma_mean"):
    cpu, cuda = [m[key] for m in runs["cpu"]], [m[key] for m in runs["cuda"]]
    print(f"{key:24s} cpu {cpu}\n{'':24s} cuda {cuda}")
    assert all(abs(a - b) <= 1e-3 * abs(a) + 1e-6 for a, b in zip(cpu, cuda)), key  # float summation order
print("cuda trainer matches the cpu trainer")
EOF

QUICK=(rollout.prompts_per_step=4 rollout.group_size=4 trainer.micro_batch_size=16 eval.before=false
       eval.after=false logging.progress=false logging.tensorboard=false task.test_size=8
       "trainer.steps=$STEPS" checkpoint.every=2)

run_train() {  # name, overrides...: a short run, then its metrics must have every step
    local name="$1"; shift
    echo "== cadence train $*"
    cadence train "${QUICK[@]}" "logging.name=$name" "logging.run_dir=$OUT/{name}" "$@"
    "$PY" - "$OUT/$name/metrics.jsonl" "$STEPS" <<'EOF'
import json, sys
steps = sorted({json.loads(line)["step"] for line in open(sys.argv[1])} - {0})
assert steps == list(range(1, int(sys.argv[2]) + 1)), steps
print(f"{sys.argv[1]}: steps {steps[0]}..{steps[-1]} logged")
EOF
}

echo "== 2. cadence train on one GPU"
run_train cuda-embedded trainer.device=cuda rollout.engine.backend=embedded
run_train cuda-bf16 trainer.device=cuda trainer.bf16_autocast=true
if "$PY" -c "import vllm" 2>/dev/null; then
    run_train cuda-vllm trainer.device=cuda rollout.engine.backend=vllm
else
    echo "vllm does not import here: the vLLM engine run is skipped"
fi

if [ "$GPUS" -ge 2 ]; then
    echo "== 3. data parallel over NCCL, 2 ranks"
    "$PY" -m pytest -x -q tests/test_dp_trainer.py -k "two_ranks_match_one_rank or critics_and_rhythm_credit"
    run_train cuda-dp-ddp trainer.device=cuda runtime.trainer_workers=2 trainer.strategy=ddp
    run_train cuda-dp-fsdp trainer.device=cuda runtime.trainer_workers=2 trainer.strategy=fsdp
    run_train cuda-dp-ray trainer.device=cuda runtime.trainer_workers=2 runtime.kind=ray runtime.trainer_cpus=2
else
    echo "== 3. skipped: data parallel over NCCL needs 2 GPUs (found $GPUS)"
fi
echo "gpu_check: all passed"
