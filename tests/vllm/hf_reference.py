"""Greedy reference tokens from Hugging Face transformers (either venv).

    .venv/bin/python tests/vllm/hf_reference.py MODEL prompts.json out.json [--max-tokens 48]

Plain `generate(do_sample=False)` of the model as it is, without any adapter: the tokens vLLM must
reproduce with sbd's plug-in (greedy = the original model's greedy output, SPEC §7).
"""

import argparse
import json

import torch


def greedy(model_dir, prompts, max_tokens: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # like vLLM's ignore_eos: an EOS is a token like any other
    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_tokens,
                                 pad_token_id=model.config.pad_token_id or 0)
            out.append(gen[0, len(p):].tolist())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompts")
    ap.add_argument("out")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    with open(args.prompts) as f:
        prompts = json.load(f)
    out = greedy(args.model, prompts, args.max_tokens)
    with open(args.out, "w") as f:
        json.dump({"tokens": out}, f)
    print(f"wrote {len(out)} greedy continuations to {args.out}")


if __name__ == "__main__":
    main()
