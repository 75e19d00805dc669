#!/usr/bin/env bash
# Issue 29, the first call on a lent GPU: everything that needs no SmolLM2 weights, in one call of at most
# 10 minutes, all results packed into one file under $OUT (the device tool brings back at most 8 files).
#
#   device run:  bash benchmarks/gpu/first_call.sh            (timeout_s 590)
#   dry run here, on the CPU, small:  DEVICE=cpu QUICK=1 OUT=runs/gpu_dry bash benchmarks/gpu/first_call.sh
#
# What it runs, in order of value per device-minute (each step under its own time limit, so that one that
# hangs or breaks leaves the others their time; every step's output goes to the log):
#   1. the machine: nvidia-smi, python, torch, CUDA, transformers;
#   2. the paper's Table 3 measured: `sbd forward-cost` on the Llama-3.1-8B shapes, bf16, batch 1/4/8/16,
#      cached 256 to 16k, widths 1-64, next to the h100/h200 roofline;
#   3. the exactness tests on the device's kernels (tiny models moved there by SBD_TEST_DEVICE);
#   4. the demo model end to end (`sbd bench`): HF greedy, prompt-lookup, our NTP loop, sbd-verify (whole
#      blocks; adaptive, the default), batch 1 and 8, eager;
#   5. the 8B shapes end to end at fixed reveal schedules against NTP and HF greedy;
#   6. the demo model compiled (CUDA graphs), batch 1;
#   7. the probe of masks fed behind the head (benchmarks/probes/masks_behind_head.py) on the demo model,
#      where width is nearly free.
# The step limits add up to 580 s.
# No package is installed: the image's python3 has torch, transformers, accelerate, matplotlib, rich, tqdm;
# the demo's prompts come from benchmarks/gpu/demo_prompts.jsonl (reasoning-gym is not on the image).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT: the folder whose files come back}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-0}
PY=${PY:-python3}
WORK=$(mktemp -d)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
LOG="$WORK/log.txt"
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log it, never stop the script
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" | tee -a "$LOG"
    timeout "$limit" "$@" >>"$LOG" 2>&1
    echo "== $name: exit $?" | tee -a "$LOG"
}
sbd() { "$PY" -m sbd.cli "$@"; }

if [ "$QUICK" = 1 ]; then  # the dry run: every step, tiny sizes
    T3=(--shape bench-21m --batch-size 1,2 --cached 64 --widths 1,4,16 --repeats 2)
    BENCH=(--n 6 --repeats 1 --batch-size 1,2 --max-new-tokens 32)
    FIXED=(--shape bench-21m --n 2 --prompt-tokens 32 --max-new-tokens 16 --batch-size 1)
    TESTS=(tests/test_verify.py -k "hf or greedy")
    DTYPE=float32
else
    T3=(--shape llama-3.1-8b --batch-size 1,4,8,16 --cached 256,1024,4096,16384 --widths 1,2,4,8,16,32,64
        --repeats 10 --hardware h100-bf16)
    BENCH=(--n 24 --repeats 2 --batch-size 1,8 --max-new-tokens 112)
    FIXED=(--shape llama-3.1-8b --n 8 --prompt-tokens 256 --max-new-tokens 256 --batch-size 1,4,8)
    TESTS=(tests/test_conformance.py tests/test_verify.py tests/test_engine.py tests/test_trees.py
           tests/test_static_shapes.py tests/test_flex_mask.py tests/test_train_consistency.py)
    DTYPE=bfloat16
fi

step machine 30 bash -c "nvidia-smi || true; $PY -c 'import sys, torch, transformers; print(sys.version); \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"available\", torch.cuda.is_available()); \
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no GPU\"); \
print(\"transformers\", transformers.__version__)'"
step table3 130 sbd forward-cost "${T3[@]}" --device "$DEVICE" --dtype "$DTYPE" --out "$WORK/table3" --no-progress
step tests 90 env SBD_TEST_DEVICE="$DEVICE" "$PY" -m pytest -q -rfE -p no:cacheprovider "${TESTS[@]}"
step bench_demo 120 sbd bench --model demo --device "$DEVICE" --prompts benchmarks/gpu/demo_prompts.jsonl \
    --methods hf,prompt-lookup,ntp,sbd-verify,sbd-verify-adaptive --block-size 8 "${BENCH[@]}" \
    --out "$WORK/bench_demo" --no-progress
step bench_8b_fixed 90 sbd bench "${FIXED[@]}" --device "$DEVICE" --dtype "$DTYPE" --methods hf,ntp,sbd-fixed \
    --fixed 2,3,4 --block-size 16 --out "$WORK/bench_8b_fixed" --no-progress
step bench_demo_compiled 60 sbd bench --model demo --device "$DEVICE" --prompts benchmarks/gpu/demo_prompts.jsonl \
    --methods hf,ntp,sbd-verify --block-size 8 --n 12 --repeats 2 --batch-size 1 --max-new-tokens 112 --compile \
    --out "$WORK/bench_demo_compiled" --no-progress
step masks_behind_head 60 "$PY" benchmarks/probes/masks_behind_head.py --model demo --behind 0,4,8 \
    $([ "$DEVICE" = cpu ] || echo --device "$DEVICE")

mkdir -p "$OUT"
tar czf "$OUT/first_call.tgz" -C "$WORK" .
cp "$LOG" "$OUT/log.txt"
echo "results: $OUT/first_call.tgz ($(du -h "$OUT/first_call.tgz" | cut -f1)), log: $OUT/log.txt"
