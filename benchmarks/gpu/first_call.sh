#!/usr/bin/env bash
# One GPU call that measures what issue "make every forward a fast one" asks, in at most 9 minutes:
#
#   device run:   bash benchmarks/gpu/first_call.sh                    (OUT is set by the device tool; timeout_s 590)
#   dry run here: DEVICE=cpu QUICK=1 OUT=runs/gpu_dry bash benchmarks/gpu/first_call.sh   (CI: tests/test_gpu_script.py)
#   the plan only: PLAN=1 OUT=/tmp/x bash benchmarks/gpu/first_call.sh  (steps and limits; exits 2 if over budget)
#
# Steps, each under its own limit (sized from the H200 run of 2026-11-26, ../shared/gpu/h200-2026-11-26/), each
# writing into $WORK, and $OUT/results.tgz re-packed after every step, so a step that is cut still leaves every
# other step's results; $OUT/steps.tsv says each step's exit status and seconds (124 = cut by its limit):
#   machine       nvidia-smi, python, torch, CUDA, transformers
#   tests         every test file that runs on the tiny models' device, on that device (SBD_TEST_DEVICE), file by file
#                 in parallel processes, `-rf --tb=line`, one log each
#   cost_8b       forward-cost of Llama-3.1-8B shapes, bf16: the engine's attention (auto), the ragged-batch plan (rows)
#                 and Hugging Face's dense-mask SDPA (dense), side by side, batch 1 and 16, cached 4k and 16k
#   cost_smollm2  the same for SmolLM2-135M shapes
#   cost_compiled SmolLM2-135M shapes eager and through torch.compile (CUDA graphs), batch 1: the launch overhead
#   quant_kernels weight-only int8/int4 linears (sbd.models.quantized on the device's kernels) against bf16 at the
#                 8B layer shapes: time, error, row invariance (benchmarks/gpu/quant_kernels.py)
#   cost_int4     the whole 8B forward with int4 weights (--weights int4), batch 1 and 16, beside cost_8b's bf16
#   fixed_8b      the 8B shapes end to end at fixed reveal schedules against NTP and HF greedy
#   train_step    training steady state: the SBD step against the NTP step on the same model and data (tokens/s)
#   demo_compiled the demo model's sbd-verify and NTP eager and compiled (CUDA graphs), batch 1
# Every sbd command runs as `python -m sbd.cli` (a shell function cannot run under `timeout`).
# Nothing is installed: the image's python3 has torch and transformers; prompts come from benchmarks/gpu/.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT: the folder whose files come back}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-0}
PLAN=${PLAN:-0}
PY=${PY:-python3}
BUDGET=560  # seconds: one device call is at most 600 s (start-up not counted), minus packing and a margin

if [ "$QUICK" = 1 ]; then  # the dry run: every step, tiny sizes, on the CPU
    L_MACHINE=60 L_TESTS=300 L_COST8=180 L_COSTS=180 L_COSTC=300 L_QK=120 L_INT4=180 L_FIXED=180 L_TRAIN=180
    L_DEMO=240 JOBS=1
    TEST_FILES=(tests/test_attention.py)
    TEST_K="uniform or rows_plan"
    COST8=(--shape tiny-gqa --batch-size 1,2 --cached 64 --widths 1,4 --repeats 2)
    COSTS=(--shape tiny-gqa --batch-size 1 --cached 32 --widths 1,4 --repeats 2)
    COSTC=(--shape tiny-gqa --batch-size 1 --cached 32 --widths 1,4 --repeats 2)
    QK=(--quick --repeats 3)
    INT4=(--shape tiny-gqa --batch-size 1 --cached 32 --widths 1,4 --repeats 2)
    FIXED=(--shape tiny-gqa --n 1 --prompt-tokens 16 --max-new-tokens 8 --batch-size 1 --repeats 1)
    TRAIN=(--seq-len 32 --batch 2 --hidden 64 --layers 2 --heads 4 --vocab 512 --steps 2 --warmup 1 --no-memory)
    DEMO=(--n 1 --max-new-tokens 16)
    COMPILE=()  # inductor's CPU compile takes minutes on 2 cores: the dry run checks the eager rows
    DTYPE=float32 HW=()
else
    # sized from the H200 run of 2026-11-28 (benchmarks/results/gpu_h200_2026-11-28/steps.tsv): 16 test files at once
    # finish in ~130 s (the slowest, test_static_shapes, alone); SmolLM2's compile needs more than 55 s
    L_MACHINE=15 L_TESTS=140 L_COST8=75 L_COSTS=30 L_COSTC=70 L_QK=25 L_INT4=50 L_FIXED=50 L_TRAIN=40 L_DEMO=65
    JOBS=16
    # the test files whose tests build tiny models on SBD_TEST_DEVICE (tests/conftest.py), most valuable first
    # (not the GPU scripts' own dry runs, which run on the CPU)
    mapfile -t TEST_FILES < <(grep -lE "DEVICE|def test_[a-z0-9_]+\((model|llama|arch)\b" tests/test_*.py \
                              | grep -v "test_gpu_")
    TEST_K=""
    COST8=(--shape llama-3.1-8b --batch-size 1,16 --cached 4096,16384 --widths 1,2,8,16 --repeats 5)
    COSTS=(--shape smollm2-135m --batch-size 1,16 --cached 256,2048 --widths 1,2,8,16 --repeats 5)
    COSTC=(--shape smollm2-135m --batch-size 1 --cached 2048 --widths 1,16 --repeats 10)
    QK=(--repeats 20)
    INT4=(--shape llama-3.1-8b --batch-size 1 --cached 4096 --widths 1,16 --repeats 5)
    FIXED=(--shape llama-3.1-8b --n 2 --prompt-tokens 256 --max-new-tokens 32 --batch-size 1 --repeats 1)
    TRAIN=(--seq-len 512 --batch 8 --hidden 512 --layers 8 --heads 8 --vocab 32000 --steps 8 --warmup 3 --no-memory)
    DEMO=(--n 2 --max-new-tokens 64)
    COMPILE=(--compile)
    DTYPE=bfloat16 HW=(--hardware h200-bf16)
fi
TOTAL=$((L_MACHINE + L_TESTS + L_COST8 + L_COSTS + L_COSTC + L_QK + L_INT4 + L_FIXED + L_TRAIN + L_DEMO))
echo "plan: machine ${L_MACHINE}s, tests ${L_TESTS}s (${#TEST_FILES[@]} files, $JOBS at once), cost_8b ${L_COST8}s," \
     "cost_smollm2 ${L_COSTS}s, cost_compiled ${L_COSTC}s, quant_kernels ${L_QK}s, cost_int4 ${L_INT4}s," \
     "fixed_8b ${L_FIXED}s, train_step ${L_TRAIN}s, demo_compiled ${L_DEMO}s: ${TOTAL}s of ${BUDGET}s"
if [ "$QUICK" != 1 ] && [ "$TOTAL" -gt "$BUDGET" ]; then
    echo "the steps' limits add up to ${TOTAL}s, over the ${BUDGET}s of one call" >&2
    exit 2
fi
[ "$PLAN" = 1 ] && exit 0

mkdir -p "$OUT"
WORK=$(mktemp -d)
LOG="$OUT/log.txt"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg SBD_CACHE="$WORK/cache"
PACK_EXCLUDE=(./cache '*.safetensors' 'checkpoint-*')
# shellcheck source=benchmarks/gpu/steps.sh
. benchmarks/gpu/steps.sh
test_files() {  # (run under `timeout` through bash -c) each file in its own process, $JOBS at once, a log each
    mkdir -p "$WORK/tests"
    xargs -P "$JOBS" -I{} bash -c '
        f={}; log="$WORK/tests/$(basename "$f" .py).txt"
        env SBD_TEST_DEVICE="$DEVICE" "$PY" -m pytest -rf --tb=line -p no:cacheprovider ${TEST_K:+-k "$TEST_K"} \
            "$f" >"$log" 2>&1
        echo "$f exit $? $(tail -n 1 "$log")" >> "$WORK/tests/summary.txt"' < "$WORK/test_files.txt"
    cat "$WORK/tests/summary.txt"
}
export -f test_files
export WORK DEVICE PY TEST_K JOBS
printf '%s\n' "${TEST_FILES[@]}" > "$WORK/test_files.txt"
S=("$PY" -m sbd.cli)

step machine "$L_MACHINE" bash -c "nvidia-smi || true; $PY -c 'import sys, torch, transformers; print(sys.version); \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"available\", torch.cuda.is_available()); \
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no GPU\"); \
print(\"transformers\", transformers.__version__); import sbd; print(\"sbd imports\")'"
step tests "$L_TESTS" bash -c test_files
step cost_8b "$L_COST8" "${S[@]}" forward-cost "${COST8[@]}" "${HW[@]}" --attention auto,rows,dense --device "$DEVICE" \
    --dtype "$DTYPE" --out "$WORK/cost_8b" --no-progress
step cost_smollm2 "$L_COSTS" "${S[@]}" forward-cost "${COSTS[@]}" --attention auto,rows,dense --device "$DEVICE" \
    --dtype "$DTYPE" --out "$WORK/cost_smollm2" --no-progress
step cost_compiled "$L_COSTC" "${S[@]}" forward-cost "${COSTC[@]}" --attention auto --compile --device "$DEVICE" \
    --dtype "$DTYPE" --out "$WORK/cost_compiled" --no-progress
step quant_kernels "$L_QK" "$PY" benchmarks/gpu/quant_kernels.py --device "$DEVICE" "${QK[@]}" --out "$WORK/quant_kernels"
step cost_int4 "$L_INT4" "${S[@]}" forward-cost "${INT4[@]}" --weights int4 --attention auto --device "$DEVICE" \
    --dtype "$DTYPE" --out "$WORK/cost_int4" --no-progress
step fixed_8b "$L_FIXED" "${S[@]}" bench "${FIXED[@]}" --device "$DEVICE" --dtype "$DTYPE" --methods hf,ntp,sbd-fixed \
    --fixed 2,4 --block-size 16 --out "$WORK/fixed_8b" --no-progress
step train_step "$L_TRAIN" "$PY" benchmarks/train_step.py "${TRAIN[@]}"
step demo_compiled "$L_DEMO" "${S[@]}" bench --model demo --device "$DEVICE" --prompts benchmarks/gpu/demo_prompts.jsonl \
    --methods ntp,sbd-verify --block-size 8 "${DEMO[@]}" --repeats 1 --batch-size 1 "${COMPILE[@]}" \
    --out "$WORK/demo_compiled" --no-progress
echo "results: $OUT/results.tgz ($(du -h "$OUT/results.tgz" | cut -f1)), steps: $OUT/steps.tsv, log: $LOG"
