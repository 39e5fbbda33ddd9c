#!/usr/bin/env bash
# GPU checks of the paths CPU CI cannot reach, on one GPU (`bash bench/gpu_checks.sh` from the
# repository root; OUT=DIR keeps the logs, PY=python, MODEL=llama-small, STEPS=300):
#   1. the profiler's CUDA path (bf16, --profile-steps 5: profile.json);
#   2. preemption on CUDA (the gloo agreement group beside NCCL): SIGUSR1 to the worker at step
#      40, torchrun --max_restarts 1 restarts it, the run resumes and finishes with no step lost;
#   3. asynchronous DCP checkpoints (the default on GPUs) every 10 steps, then a resume.
# Each prints its exit status and the run's summary; docs/reliability.md says what it found.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"; rm -rf /tmp/r1 /tmp/r2 /tmp/r3
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-llama-small}
nvidia-smi -L 2>/dev/null
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
run() { $PY -m torch.distributed.run --nproc_per_node 1 --rdzv_backend c10d \
        --rdzv_endpoint localhost:0 "$@"; }
COMMON=(--model "$MODEL" --device "$DEVICE" --log-every 10 --eval-every 0 --tensorboard false)

echo "=== 1. profiler on $DEVICE, bf16"
run -m trainers.ddp "${COMMON[@]}" --dtype bf16 --steps 30 --profile-steps 5 \
    --resume none --output-dir /tmp/r1 > "$OUT/1-profile.log" 2>&1
echo "exit $?"; tail -4 "$OUT/1-profile.log"
cp /tmp/r1/profile.json "$OUT/1-profile.json" 2>/dev/null
$PY -c "import json; p=json.load(open('/tmp/r1/profile.json')); print({k: p[k] for k in list(p)[:8]})"

echo "=== 2. SIGUSR1 to the worker mid-run: save, torchrun restart, resume"
run --max_restarts 1 -m trainers.ddp "${COMMON[@]}" --steps "${STEPS:-300}" --checkpoint-every 100 \
    --resume auto --output-dir /tmp/r2 > "$OUT/2-preempt.log" 2>&1 &
launcher=$!
for _ in $(seq 600); do
    step=$(tail -1 /tmp/r2/metrics.jsonl 2>/dev/null | $PY -c \
        "import json,sys; print(json.loads(sys.stdin.read() or '{}').get('step', 0))" 2>/dev/null)
    [ "${step:-0}" -ge 40 ] && break
    sleep 0.2
done
worker=$(pgrep -f -- "-u -m trainers.ddp" | head -1)
echo "signalling worker $worker at step ${step:-?}"
kill -USR1 "$worker"
wait $launcher; echo "exit $?"
grep -E "preempted|resum|restart|failed \(exitcode" "$OUT/2-preempt.log" | head -8
$PY -c "import json; s=json.load(open('/tmp/r2/summary.json')); print({k: s.get(k) for k in ('restarts','resumed_from_step','steps_lost','preempted','steps','final_loss')})"

echo "=== 3. async checkpoints, then resume"
run -m trainers.ddp "${COMMON[@]}" --steps 40 --checkpoint-every 10 --async-checkpoint true \
    --resume none --output-dir /tmp/r3 > "$OUT/3-async.log" 2>&1
echo "exit $?"; ls /tmp/r3/checkpoints
run -m trainers.ddp "${COMMON[@]}" --steps 50 --async-checkpoint true \
    --output-dir /tmp/r3 --resume auto > "$OUT/3-resume.log" 2>&1
echo "exit $?"; grep -iE "resum" "$OUT/3-resume.log" | head -3
