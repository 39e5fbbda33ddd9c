#!/usr/bin/env bash
# A small code model trained offline on this interpreter's own standard library, on the CPU:
# train a BPE tokenizer on the top-level stdlib modules, tokenize them, train llama-small
# under the fsdp component on local_cwd (2 processes), and sample from the newest checkpoint.
#
#   examples/stdlib_code/run.sh                 # the demo (README "Your model, your data")
#   STEPS=4 BATCH=4 examples/stdlib_code/run.sh # the short version CI runs
#
# Run from the repository root with the virtual environment active.
set -euo pipefail
steps=${STEPS:-200}
batch=${BATCH:-16}
out=${OUT:-outputs/stdlib_code}
stdlib=$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
corpus="$stdlib/*.py"

mkdir -p "$out"
python -m trainers.tools.train_tokenizer "$corpus" --vocab-size 4096 --output "$out/tokenizer.json"
python -m trainers.tools.prepare_data "$corpus" "$out/stdlib.bin" --tokenizer "$out/tokenizer.json"
torchx run -s local_cwd components/fsdp.py:fsdp -j 1x2 -- \
    --model llama-small --data "$out/stdlib.bin" --tokenizer "$out/tokenizer.json" \
    --steps "$steps" --batch-size "$batch" --warmup-steps $((steps / 10)) \
    --eval-every $((steps / 4 > 0 ? steps / 4 : 1)) --checkpoint-every "$steps" \
    --log-every 10 --output-dir "$out/run"
python -m trainers.tools.sample "$out/run" --prompt "def read_config(path):" --tokens 64 \
    --temperature 0.8 --top-k 40
