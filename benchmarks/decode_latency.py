"""Forward latency per block width and the decoding loop's own overhead, on a ~20M random Llama.

Usage: python benchmarks/decode_latency.py [--threads 2] [--repeats 30] [--context 128] [--model DIR]
(--model: any local model folder sbd.load accepts, instead of the random 21M Llama.)
Prints a Markdown report (record it in benchmarks/results/decode_latency.md).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from types import SimpleNamespace

import torch

import sbd
from sbd.models import tiny
from sbd.decoding.cache import crop, slab_cache
from sbd.masks import inference_mask
from sbd.models.cache_arg import with_cache


def build(vocab: int = 8192):
    cfg = tiny.tiny_config("llama", vocab_size=vocab, hidden=512, layers=4, heads=8, kv_heads=8,
                           intermediate=1376, context=2048)
    model = tiny.random_model(cfg, seed=0, logit_scale=100.0)
    model.config.sbd_mask_token_id = vocab - 1
    return model


def forward_latency(model, context: int, width: int, n_commit: int, repeats: int) -> float:
    """Median seconds of one cached forward of `width` tokens (first `n_commit` causal, rest a block)."""
    vocab = model.config.vocab_size
    pad = torch.zeros(1, dtype=torch.long)
    cache = slab_cache(model, context + width + 1)
    ids = torch.randint(0, vocab, (1, context))
    with torch.inference_mode():
        model(input_ids=ids, position_ids=torch.arange(context)[None], attention_mask=inference_mask(pad, 0, context, 0),
              **with_cache(model, cache), use_cache=True, logits_to_keep=1)
        x = torch.randint(0, vocab, (1, width))
        pos = torch.arange(context, context + width)[None]
        mask = inference_mask(pad, context, n_commit, width - n_commit)
        times = []
        for i in range(repeats + 3):
            t = time.perf_counter()
            model(input_ids=x, position_ids=pos, attention_mask=mask, **with_cache(model, cache), use_cache=True,
                  logits_to_keep=width - n_commit if width > n_commit else 1)
            times.append(time.perf_counter() - t)
            crop(cache, width)
        return statistics.median(times[3:])


class Timed(torch.nn.Module):
    """Wraps the model to add up the time spent inside its forward calls."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config, self.generation_config = inner, inner.config, inner.generation_config
        self.seconds, self.calls = 0.0, 0
        self.forward = self._forward  # keeps the inner signature check for logits_to_keep honest

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def _forward(self, input_ids, position_ids, attention_mask, past_key_values, use_cache=True, logits_to_keep=0):
        t = time.perf_counter()
        out = self.inner(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                         **with_cache(self.inner, past_key_values), use_cache=use_cache, logits_to_keep=logits_to_keep)
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return out


def loop_overhead(model, method: str, gamma: float, repeats: int, prompt_len: int = 64, new: int = 128):
    """Median seconds per forward spent outside the model call during `generate`."""
    prompt = torch.randint(3, model.config.vocab_size - 1, (prompt_len,)).tolist()
    per_forward, nfes = [], []
    for i in range(repeats + 1):
        timed = Timed(model).eval()  # a decoding call should find the model in eval mode, as loaded
        t = time.perf_counter()
        out = sbd.generate(timed, None, [prompt], method=method, max_new_tokens=new, eos_token_ids=[],
                           **({"gamma": gamma, "block_size": 16} if method == "sbd" else {}))  # NTP reads neither
        total = time.perf_counter() - t
        if i:
            per_forward.append((total - timed.seconds) / timed.calls)
            nfes.append(out.nfe[0])
    return statistics.median(per_forward), statistics.median(nfes)


class Instant(torch.nn.Module):
    """A stand-in model that answers at once with fixed logits: what remains is the loop's own cost."""

    def __init__(self, like):
        super().__init__()
        self.config, self.generation_config = like.config, like.generation_config
        self.embed = like.get_input_embeddings()
        vocab = like.config.vocab_size
        self.table = torch.randn(64, vocab, generator=torch.Generator().manual_seed(0)) * 45
        self.kv = torch.zeros(1, 1, 64, 1)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, position_ids, attention_mask, past_key_values, use_cache=True, logits_to_keep=0):
        b, q = input_ids.shape
        kv = self.kv[:, :, :q].expand(b, 1, q, 1)
        for i in range(len(past_key_values.layers)):
            past_key_values.update(kv, kv, i)
        n = logits_to_keep or q
        return SimpleNamespace(logits=self.table[:n].expand(b, n, -1).clone())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--model", help="local model folder (default: a random 21M Llama)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model:
        model, tokenizer = sbd.load(args.model)
        sbd.add_mask_token(model, tokenizer)
        what = f"{args.model} ({type(model).__name__}, vocab {model.config.vocab_size})"
    else:
        model = build()
        what = "random Llama (hidden 512, 4 layers, vocab 8192)"
    n_params = sum(p.numel() for p in model.parameters())
    print(f"# Decode latency: {n_params / 1e6:.1f}M-parameter {what}, fp32")
    print(f"\nMachine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} threads; cached context {args.context} tokens; median of {args.repeats} after 3 warm-up.\n")
    print("| width w | block forward (w masks) ms | commit forward (w causal + w masks) ms | w x 1-token NTP ms | block / 1-token |")
    print("|---|---|---|---|---|")
    one = forward_latency(model, args.context, 1, 1, args.repeats)
    for w in (1, 2, 4, 8, 16, 32):
        blk = forward_latency(model, args.context, w, 0, args.repeats)
        com = forward_latency(model, args.context, 2 * w, w, args.repeats)
        print(f"| {w} | {blk * 1e3:.2f} | {com * 1e3:.2f} | {w * one * 1e3:.2f} | {blk / one:.2f}x |")
    print(f"\n1-token causal forward (NTP step): {one * 1e3:.2f} ms\n")
    print("Loop overhead: wall time of `generate` minus time inside model forwards, per forward "
          f"(prompt 64, 128 new tokens, block 16, median of {max(3, args.repeats // 5)} runs).\n")
    print("| method | gamma | NFE | overhead per forward ms | overhead / 1-token forward |")
    print("|---|---|---|---|---|")
    instant = Instant(model).eval()
    for method, gamma in (("ntp", 0.0), ("sbd", 0.0), ("sbd", 0.35), ("sbd", float("inf"))):
        ov, nfe = loop_overhead(model, method, gamma, max(3, args.repeats // 5))
        print(f"| {method} | {gamma} | {nfe:.0f} | {ov * 1e3:.3f} | {ov / one * 100:.1f}% |")
    print(f"\nThe same loop around an instant stand-in model (fixed logits, vocab {model.config.vocab_size}): the loop's own cost "
          "with warm caches, per forward.\n")
    print("| method | gamma | NFE | loop per forward ms | loop / 1-token forward |")
    print("|---|---|---|---|---|")
    for method, gamma in (("ntp", 0.0), ("sbd", 0.0), ("sbd", 0.35), ("sbd", float("inf"))):
        ov, nfe = loop_overhead(instant, method, gamma, args.repeats)
        print(f"| {method} | {gamma} | {nfe:.0f} | {ov * 1e3:.3f} | {ov / one * 100:.1f}% |")


if __name__ == "__main__":
    main()
