#!/usr/bin/env bash
# plain-SBD drafter : the shipped adapter + head, warm-started, trained on partially
# revealed blocks (eta ~ U(0,1), no --mask-rate), no position decay; resumable with --resume
cd "$(dirname "$0")/../../../.."
exec sbd train --model runs/campaign/start45 --data runs/campaign/train45.jsonl --adapter lora --sampler-head \
  --kl-weight 1 --block-size-min 2 --block-size-max 8 --align-to-completion --lr 5e-4 \
  --warmup-steps 10 --max-len 2048 --save-steps 20 --save-total-limit 2 --logging-steps 5 --group-by-length \
  --batch-size 8 --noisy-blocks 4 --train-layers-from 15 --bf16 --seed 45 \
  --out runs/campaign/sbd45 --steps 1464 --no-progress "$@"
