#!/usr/bin/env bash
# Issue 17's arms at an equal budget: 400 sequences seen (50 steps x 8) on the same 480 self-distilled
# answers (distill_train.jsonl, made by adapter_study.sh step 2), the same recipe (completion only, every
# block position masked, k ~ U{2..16}, max 512 tokens, seed 0, checkpoints at 200 and 400 sequences):
#   (ii)  full fine-tune (SBD loss: NTP + masked), lr 1e-4 as the first full fine-tune (arm i)
#   (iii) adapter without KL, lr 1e-3 as arm (iv)
#   (iv)  adapter + KL: the first 50 steps of adapter_study.sh step 4 (its checkpoints 25 and 50)
# then the curves of all three on the held-out sets, against the ORIGINAL model's greedy tokens.
# Resumable: re-run it and finished steps are skipped.  bash benchmarks/smollm2/arms.sh [WORK]
set -euo pipefail
WORK=$(realpath -m "${1:-runs/smollm2}")
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$WORK"
COMMON="--data distill_train.jsonl --mask-rate 1.0 --align-to-completion --steps 50 --batch-size 8 --max-len 512 \
  --save-steps 25 --save-total-limit 0 --logging-steps 5 --seed 0 --no-progress"

train() {  # OUT ARGS...: train unless finished, resuming from the newest checkpoint
  local out=$1; shift
  [ -f "$out/sbd_train.json" ] && [ -f "$out/done" ] && return
  local resume=""; ls -d "$out"/checkpoint-* >/dev/null 2>&1 && resume="--resume"
  local t0=$SECONDS
  sbd train --model base --out "$out" $COMMON "$@" $resume
  echo "$((SECONDS - t0)) s" > "$out/done"
}

train arm3_adapter_nokl --adapter lora --rank 16 --alpha 32 --kl-weight 0 --lr 1e-3 --warmup-steps 10
train arm2_full --mode sbd --lr 1e-4 --warmup-steps 10

for set in gsm other; do
  out="$HERE/results/arms_$set.md"
  [ -f "$out" ] && continue
  python "$HERE/learning_curve.py" arm2_full arm3_adapter_nokl adapter --upto 50 --reference base \
    --prompts heldout_$set.jsonl --n 6 --block-size 8 --out "$out.tmp"
  mv "$out.tmp" "$out"
done
