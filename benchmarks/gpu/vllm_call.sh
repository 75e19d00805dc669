#!/usr/bin/env bash
# sbd's vLLM plug-in on a GPU, with upstream vLLM's CUDA build (the plug-in is written against vLLM 0.32; use
# 0.32.x): does a forward with masks run vLLM's compiled graph and CUDA graphs, keep vLLM's tokens, and cost
# what a plain step costs? The device machines lent to this project cannot install vLLM (nothing reaches
# them but the checkout and carried files, at most 64 MiB; vLLM's CUDA wheel is larger), so this is the
# script for a GPU machine that has vLLM, and its dry run runs here on vLLM's CPU build:
#
#   GPU machine:  pip install vllm==0.32.* && pip install --no-deps -e . && OUT=runs/vllm_gpu bash benchmarks/gpu/vllm_call.sh
#   dry run here: DEVICE=cpu QUICK=1 OUT=/tmp/vllm_dry PY=~/.cache/sbd/vllm-0.32.0/bin/python bash benchmarks/gpu/vllm_call.sh
#                 (tests/test_gpu_vllm_script.py runs it where `sbd vllm-setup` has made vLLM's environment)
#
# Steps (each under its own limit, results re-packed into $OUT/results.tgz after each, $OUT/steps.tsv):
#   machine  nvidia-smi, python, torch, vLLM
#   model    a random model of SmolLM2-135M's sizes (SHAPE) with a random, non-zero drafting adapter
#            (tests/vllm/make_tiny.py); no weights need to travel, and step costs depend on sizes only
#   exact    vLLM plain and vLLM + sbd's masks (every step, float32, 16 requests at once): the same tokens, and
#            with vLLM compiled not one forward of the plug-in run eagerly (its own count)
#   cost_*   seconds per engine step in bfloat16, batch 1 and 16 at once: vLLM plain; the plug-in never drafting
#            (its plain steps, the gate's price); the plug-in with masks every step (a block's price)
#   check    benchmarks/gpu/vllm_check.py: summary.md, exit 1 if exactness or the no-eager rule failed
# What differs on CUDA vLLM (attention backend, CUDA graphs, rejection sampler): docs/serving.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT: the folder whose files come back}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-0}
PY=${PY:-python3}
if [ "$QUICK" = 1 ]; then  # the dry run: tiny sizes, vLLM's CPU build, eager (its CPU compile takes minutes)
    SHAPE="" N=4 TOKENS=16 L_MODEL=120 L_RUN=240 COMPILED=() TIMED=(cost_masks_all) REPEAT=1
else
    SHAPE=smollm2-135m N=16 TOKENS=128 L_MODEL=120 L_RUN=300 COMPILED=(--compiled) REPEAT=3
    TIMED=(cost_plain_1 cost_idle_1 cost_masks_1 cost_plain_all cost_idle_all cost_masks_all)
fi

mkdir -p "$OUT"
WORK=$(mktemp -d)
LOG="$OUT/log.txt"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 SBD_CACHE="$WORK/cache"
PACK_EXCLUDE=(./model ./cache)
# shellcheck source=benchmarks/gpu/steps.sh
. benchmarks/gpu/steps.sh
run() {  # run NAME ARGS...: tests/vllm/run_vllm.py on the model and prompts, result in $WORK/NAME.json
    local name=$1
    shift
    step "$name" "$L_RUN" "$PY" tests/vllm/run_vllm.py "$WORK/model" --prompts "$WORK/prompts.json" \
        --out "$WORK/$name.json" --max-tokens "$TOKENS" --max-num-seqs 16 --spec-tokens 7 "$@"
}
MASKS=(--mode sbd --override sbd_lookup=false --override 'sbd_draft="block"')
IDLE=(--mode sbd --override sbd_masks=0 --override sbd_lookup=false)

step machine 30 bash -c "nvidia-smi || true; $PY -c 'import sys, torch; print(sys.version); \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"available\", torch.cuda.is_available()); \
import vllm; print(\"vllm\", vllm.__version__); import sbd; print(\"sbd imports\")'"
step model "$L_MODEL" "$PY" tests/vllm/make_tiny.py "$WORK/model" ${SHAPE:+--shape "$SHAPE"}
"$PY" -c "import json, random; from transformers import AutoTokenizer; random.seed(0); \
n = len(AutoTokenizer.from_pretrained('$WORK/model')) - 1; \
json.dump([[random.randrange(3, n) for _ in range(64)] for _ in range($N)], open('$WORK/prompts.json', 'w'))"
run exact_plain --mode plain --dtype float32 "${COMPILED[@]}"
run exact_sbd "${MASKS[@]}" --dtype float32 "${COMPILED[@]}"
for name in "${TIMED[@]}"; do
    case $name in
        cost_plain_*) kind=(--mode plain) ;;
        cost_idle_*) kind=("${IDLE[@]}") ;;
        cost_masks_*) kind=("${MASKS[@]}") ;;
    esac
    run "$name" "${kind[@]}" --dtype bfloat16 --batch "${name##*_}" --repeat "$REPEAT" "${COMPILED[@]}"
done
step check 30 "$PY" benchmarks/gpu/vllm_check.py "$WORK"
cp "$WORK/summary.md" "$OUT/summary.md" 2>/dev/null
echo "results: $OUT/results.tgz, summary: $OUT/summary.md, steps: $OUT/steps.tsv, log: $LOG"
