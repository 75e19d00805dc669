#!/usr/bin/env bash
# The drafter's plateau (../shared/research/drafter-plateau.md): two short runs from the shipped drafter (adapter + head, restored
# by `state.py restore runs/campaign/start`) on the same 2,048 answers (train46.jsonl: mix.py --new-after
# 11514 --old-share 0.5 --seed 46, first 2,048 in the run's order), the shipped run's recipe otherwise:
#   cool  : learning-rate cool-down, 2e-4 falling as 1 - sqrt to 0 (the shipped runs: cosine from 5e-4)
#   lcm   : the same + the latent-consistency term (--latent-weight 1)
# One core each (run both at once: taskset -c 0 ... cool & taskset -c 1 ... lcm); resumable with --resume.
set -e
variant=$1; shift
case $variant in
  cool) extra=() ;;
  lcm) extra=(--latent-weight 1) ;;
  *) echo "usage: train46.sh cool|lcm [--resume]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../../../.."
exec sbd train --model runs/campaign/start --data runs/campaign/train46.jsonl --adapter lora --sampler-head \
  --kl-weight 1 "${extra[@]}" --schedule cooldown --block-size-min 2 --block-size-max 8 --align-to-completion \
  --mask-rate 1.0 --lr 2e-4 --warmup-steps 8 --max-len 2048 --save-steps 32 --save-total-limit 2 --logging-steps 4 \
  --group-by-length --batch-size 8 --noisy-blocks 4 --train-layers-from 15 --position-decay 0.8 --bf16 --seed 46 \
  --out runs/campaign/p46_$variant --steps 256 --no-progress "$@"
