#!/usr/bin/env bash
# The drafter's plateau, third lever (../shared/research/drafter-plateau.md R2): a sampler head that carries its
# own state from draft to draft. Two head-only runs over the shipped adapter (frozen), from the shipped head
# (restored by `state.py restore runs/campaign/start`), on the same 2,048 answers as train46.sh
# (train46.jsonl, first 256 steps x 8 in the run's order), the shipped head-only recipe otherwise:
#   state : the head gains a state at zero (--sampler-head-state: it starts by drafting exactly as shipped)
#   plain : the same run without the state (the control: what the new answers alone give)
# One core each (taskset -c 0 ... state & taskset -c 1 ... plain); resumable with --resume.
set -e
variant=$1; shift
case $variant in
  state) extra=(--sampler-head-state) ;;
  plain) extra=() ;;
  *) echo "usage: head_state.sh state|plain [--resume]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../../../.."
exec sbd train --model runs/campaign/start --data runs/campaign/train46.jsonl --adapter lora --sampler-head-only \
  "${extra[@]}" --block-size-min 2 --block-size-max 8 --align-to-completion --mask-rate 1.0 --lr 1e-3 \
  --warmup-steps 10 --max-len 2048 --save-steps 32 --save-total-limit 2 --logging-steps 4 --group-by-length \
  --batch-size 8 --noisy-blocks 4 --bf16 --seed 46 --out runs/campaign/head_$variant --steps 256 --no-progress "$@"
