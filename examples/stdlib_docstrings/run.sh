#!/usr/bin/env bash
# Fine-tuning, offline on the CPU: the stdlib_code demo's model learns to write a function's
# body from its signature and docstring. Build the instruction set from this interpreter's
# standard library (make_data.py: held-out package modules last), export the pretraining run
# to Hugging Face format, fine-tune it with LoRA (rank 16 on every linear layer but the head)
# under the fsdp component on local_cwd (2 processes), print the held-out completion loss's
# first and last evaluation, and sample the body of a held-out function from its docstring.
#
#   examples/stdlib_docstrings/run.sh                  # the example (docs/finetuning.md)
#   STEPS=4 BATCH=4 examples/stdlib_docstrings/run.sh  # the short version CI runs
#
# PRETRAINED is the stdlib_code demo's OUT (default outputs/stdlib_code); its run is made with
# examples/stdlib_code/run.sh (same STEPS and BATCH) if it has no summary.json. OUT must be new
# or this script's earlier OUT for the same PRETRAINED (the export is kept, the run resumes).
# Run from the repository root with the virtual environment active.
set -euo pipefail
steps=${STEPS:-240}
batch=${BATCH:-16}
pretrained=${PRETRAINED:-outputs/stdlib_code}
out=${OUT:-outputs/stdlib_docstrings}

[ -f "$pretrained/run/summary.json" ] || OUT="$pretrained" examples/stdlib_code/run.sh
[ -f "$out/base/config.json" ] || python -m trainers.tools.export "$pretrained/run" "$out/base"
read -r held val_fraction < <(python -m examples.stdlib_docstrings.make_data \
    "$out/base/tokenizer.json" "$out" --seq-len 256)
torchx run -s local_cwd components/fsdp.py:fsdp -j 1x2 -- \
    --model "hf:$out/base" --tokenizer "$out/base/tokenizer.json" --seq-len 256 \
    --data "$out/instructions.jsonl" --val-fraction "$val_fraction" \
    --lora-rank 16 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj \
    --steps "$steps" --batch-size "$batch" --warmup-steps $((steps / 10)) \
    --eval-every $((steps / 10 > 0 ? steps / 10 : 1)) --eval-batches $(((held + batch - 1) / batch)) \
    --checkpoint-every "$steps" --log-every 10 --output-dir "$out/run"
python -c 'import json, sys
evals = [m for m in map(json.loads, open(sys.argv[1])) if "eval_loss" in m]
print("held-out completion loss: %.4f at step %d -> %.4f at step %d" % (
    evals[0]["eval_loss"], evals[0]["step"], evals[-1]["eval_loss"], evals[-1]["step"]))' \
    "$out/run/metrics.jsonl"
prompt=$(cat "$out/prompt.txt"; echo .)  # the dot keeps the prompt's last newline
python -m trainers.tools.sample "$out/run" --prompt "${prompt%.}" --tokens 48 --temperature 0 \
    --stop-at-end
