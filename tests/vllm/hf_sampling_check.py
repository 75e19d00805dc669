"""Sampled outputs follow the model's own distribution (either venv): a z-test against exact
Hugging Face probabilities.

    python tests/vllm/hf_sampling_check.py MODEL prompts.json samples.json --temperature 0.7

samples.json: `run_vllm.py --out` of requests sampled at that temperature (prompts.json: their prompts).
For every sampled token t at every position, with p the model's distribution there (softmax(logits / T),
the mask token excluded as the plug-in excludes it), E[p(t)] = sum p^2 when t ~ p. The sum over all
positions of p(t) - sum p^2 is a martingale, so z = that sum / sqrt(sum of (sum p^3 - (sum p^2)^2)) is
about N(0, 1) when vLLM samples from p; a draft leaking into the distribution (a mask emitted, a draft
token favoured) pushes |z| up. Exit 1 when |z| > 4.
"""

import argparse
import json
import math

import torch


def z_score(model_dir, prompts, samples, temperature: float) -> tuple[int, int, float]:
    """(tokens, mask tokens among them, z)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    mask_id = getattr(model.config, "sbd_mask_token_id", None)
    total = var = 0.0
    n = masks = 0
    with torch.no_grad():
        for prompt, out in zip(prompts, samples):
            masks += sum(t == mask_id for t in out)
            ids = torch.tensor([prompt + out])
            logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) + len(out) - 1].double()
            if mask_id is not None:
                logits[:, mask_id] = -math.inf
            p = torch.softmax(logits / temperature, dim=-1)
            s2 = (p * p).sum(-1)
            s3 = (p * p * p).sum(-1)
            got = p.gather(-1, torch.tensor(out)[:, None])[:, 0]
            total += float((got - s2).sum())
            var += float((s3 - s2 * s2).sum())
            n += len(out)
    return n, masks, total / math.sqrt(var)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompts")
    ap.add_argument("samples")
    ap.add_argument("--temperature", type=float, required=True)
    args = ap.parse_args()
    with open(args.prompts) as f:
        prompts = json.load(f)
    with open(args.samples) as f:
        samples = json.load(f)["tokens"]
    n, masks, z = z_score(args.model, prompts, samples, args.temperature)
    print(f"sampled tokens: {n}, mask tokens emitted: {masks}, z = {z:+.2f} (|z| <= 4 expected)")
    raise SystemExit(0 if abs(z) <= 4 and masks == 0 else 1)


if __name__ == "__main__":
    main()
