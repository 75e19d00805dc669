"""sbd-verify inside vLLM's CPU build: exact outputs, drafts from sbd's adapter, no mask ever committed.

Runs with vLLM's venv only (skipped elsewhere), pinned the way tests/vllm/README.md says. The engine runs in
subprocesses (tests/vllm/run_vllm.py), about 30 s of start-up each; the references (Hugging Face greedy,
sbd's gated adapter, exact probabilities) are computed here with transformers + sbd.drafters.adapter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# "vllm" alone would find this folder (tests/vllm) as a namespace package where vLLM is not installed
pytest.importorskip("vllm.config")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import hf_mask_parity  # noqa: E402
import hf_reference  # noqa: E402
import hf_sampling_check  # noqa: E402
import make_tiny  # noqa: E402

TEXTS = ["hello world", "the cat sat on the mat and the cat sat on", "one two three one two three one two",
         "a b c d e f g", "the quick brown fox jumps over the lazy dog", "set block decoding is fast",
         "1 2 3 4 5 6 7 8 9", "once upon a time there was"]
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = make_tiny.make(tmp_path_factory.mktemp("vllm") / "tiny_llama")
    tok = AutoTokenizer.from_pretrained(folder)
    prompts = [tok.encode(t) for t in TEXTS]
    path = folder.parent / "prompts.json"
    path.write_text(json.dumps(prompts))
    return {"folder": folder, "prompts": prompts, "prompts_file": path,
            "greedy": hf_reference.greedy(folder, prompts, MAX_TOKENS)}


def run(folder, prompts_file, out, *args) -> dict:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cmd = [sys.executable, str(HERE / "run_vllm.py"), str(folder), "--prompts", str(prompts_file), "--out", str(out),
           "--max-tokens", str(MAX_TOKENS), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(Path(out).read_text())


# -- fast: no engine ---------------------------------------------------------------------------------
def test_lookup_matches_sbd():
    """The proposer's prompt lookup (the scan `draft`) is sbd's (`LookupIndex`, what `VerifyRow` drafts
    with) token for token."""
    from sbd.decoding.proposers.lookup import LookupIndex
    from sbd.decoding.proposers.lookup import draft as lookup

    rng = np.random.default_rng(0)
    for trial in range(300):
        seq = rng.integers(0, 6 if trial % 2 else 30, size=int(rng.integers(1, 60))).tolist()
        assert lookup(np.array(seq), 15) == LookupIndex(seq).find([], 15), seq


def test_cpu_expand_fix():
    """vllm-cpu 0.32's expand kernel leaves float outputs unwritten (sampled speculative decoding draws
    from garbage temperatures); the plug-in's fix writes them."""
    import torch

    import vllm._custom_ops  # noqa: F401 (loads the CPU ops)
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler as rs

    if not current_platform.is_cpu():
        pytest.skip("the CPU build's kernel")
    current_platform.register_triton_kernel_overrides()
    from sbd.integrations.vllm.plugin import fix_cpu_expand_kernel

    assert fix_cpu_expand_kernel()
    temps = torch.tensor([0.7, 0.0], dtype=torch.float32)
    got = rs.expand_batch_to_tokens(temps, torch.tensor([2, 5], dtype=torch.int32), 5, replace_from=0, replace_to=1)
    assert torch.allclose(got, torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0]))


# -- the engine --------------------------------------------------------------------------------------
def test_greedy_is_the_models_own(tiny, tmp_path):
    """Greedy: plain vLLM, and vLLM with sbd's drafts (masks alone, masks + lookup; 8 prompts batched and
    one at a time) all give Hugging Face's greedy tokens; the drafts were really fed (masks gated)."""
    greedy = tiny["greedy"]
    plain = run(tiny["folder"], tiny["prompts_file"], tmp_path / "plain.json", "--mode", "plain")
    assert plain["tokens"] == greedy
    trace = tmp_path / "trace.jsonl"
    masks = run(tiny["folder"], tiny["prompts_file"], tmp_path / "masks.json", "--mode", "sbd",
                "--override", "sbd_lookup=false", "--override", 'sbd_draft="block"', "--trace", str(trace))
    assert masks["tokens"] == greedy
    assert masks["stats"]["mask_drafts"] > 0 and masks["stats"]["chain_tokens"] > 0
    # the masks' drafts are sbd's gated adapter's (causal: vLLM's CPU attention has no block mask)
    checked, agree = hf_mask_parity.check(tiny["folder"], trace, limit=100)
    assert checked >= 50 and agree == checked
    alone = run(tiny["folder"], tiny["prompts_file"], tmp_path / "alone.json", "--mode", "sbd", "--batch", "1",
                "--override", "sbd_lookup=true")
    assert alone["tokens"] == greedy
    assert alone["stats"]["lookup_drafts"] > 0


def _masks_alone(folder, tmp_path):
    """vLLM + sbd with the masks' drafts alone (whole blocks, no lookup) on 4 prompts of the tiny model in
    `folder`: (the run's result, Hugging Face's greedy tokens)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    prompts = [tok.encode(t) for t in TEXTS[:4]]
    prompts_file = tmp_path / "prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    got = run(folder, prompts_file, tmp_path / "out.json", "--mode", "sbd", "--override", "sbd_lookup=false",
              "--override", 'sbd_draft="block"')
    return got, hf_reference.greedy(folder, prompts, MAX_TOKENS)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral"])
def test_other_families_keep_their_tokens(arch, tmp_path):
    """The Qwen2, Qwen3 and Mistral classes (`SBDQwen2ForCausalLM`, ...): a tiny random model of each family
    with a random adapter drafts with its masks in vLLM, and the outputs are Hugging Face's greedy tokens."""
    got, greedy = _masks_alone(make_tiny.make(tmp_path / f"tiny_{arch}", arch=arch), tmp_path)
    assert got["tokens"] == greedy
    assert got["stats"]["mask_drafts"] > 0 and got["stats"]["chain_tokens"] > 0


@pytest.mark.parametrize("head", ["plain", "state"])
def test_a_sampler_head_drafts_and_keeps_the_models_tokens(head, tmp_path):
    """A random sampler head beside the adapter (stateless, and one carrying its state from draft to draft)
    redrafts the masks' chains inside vLLM; the outputs stay Hugging Face's greedy tokens."""
    got, greedy = _masks_alone(make_tiny.make(tmp_path / "tiny_head", head=head), tmp_path)
    assert got["tokens"] == greedy
    assert got["stats"]["head_chains"] > 0 and got["stats"]["chain_tokens"] > 0


def _compiled_masks(tiny, tmp_path, *overrides) -> dict:
    """Masks alone, vLLM compiled: outputs greedy, drafts = sbd's gated adapter's, no forward eager."""
    trace = tmp_path / "trace.jsonl"
    masks = run(tiny["folder"], tiny["prompts_file"], tmp_path / "masks.json", "--mode", "sbd", "--compiled",
                "--override", "sbd_lookup=false", "--override", 'sbd_draft="block"', "--trace", str(trace),
                *overrides)
    assert masks["tokens"] == tiny["greedy"]
    st = masks["stats"]
    assert st["compiled"] is True
    assert st["mask_drafts"] > 0 and st["chain_tokens"] > 0
    assert st["forwards"] > 0 and st["eager_forwards"] == 0, st
    checked, agree = hf_mask_parity.check(tiny["folder"], trace, limit=100)
    assert checked >= 50 and agree == checked
    return st


def test_compiled_forwards_with_masks_keep_the_models_tokens(tiny, tmp_path):
    """vLLM's default, compiled: every forward, with masks or without, runs vLLM's compiled graph (none of
    them eagerly: counted), the masks' drafts are still sbd's gated adapter's (the same drafts as the eager
    path's, which test_greedy_is_the_models_own checks the same way), and the outputs are Hugging Face's
    greedy tokens, with masks drafting (masks alone) and with the adaptive defaults stepping aside."""
    greedy = tiny["greedy"]
    _compiled_masks(tiny, tmp_path)
    aside = run(tiny["folder"], tiny["prompts_file"], tmp_path / "aside.json", "--mode", "sbd", "--compiled",
                "--override", "sbd_cost_slope=10", "--override", "sbd_lookup=true")
    assert aside["tokens"] == greedy
    st = aside["stats"]
    assert st["compiled"] is True and st["plain_engine_steps"] >= 0.8 * st["engine_steps"], st
    assert st["mask_drafts"] + st["lookup_drafts"] > 0, st  # the probes: forwards with masks among plain ones
    assert st["eager_forwards"] == 0, st


def test_the_dense_gate_path_compiled(tiny, tmp_path):
    """The gate's "dense" path (the GPU's: every row updated, kept where the gate is open; no branch on the
    host, so CUDA graphs can capture it), compiled on this CPU: the same tokens and drafts, none eager."""
    _compiled_masks(tiny, tmp_path, "--override", 'sbd_gate_path="dense"')


def test_eager_forwards_are_counted(tiny, tmp_path):
    """The count the compiled test relies on can fail: under enforce_eager every forward is counted."""
    got = run(tiny["folder"], tiny["prompts_file"], tmp_path / "eager.json", "--mode", "sbd",
              "--override", "sbd_lookup=false", "--override", 'sbd_draft="block"')
    st = got["stats"]
    assert st["compiled"] is False and st["forwards"] > 0 and st["eager_forwards"] == st["forwards"], st


def test_adaptive_steps_aside(tiny, tmp_path):
    """Adaptive drafting (the default): with a forced-expensive cost no draft pays, so the proposer returns
    no drafts (bar sbd's one-token probes) and vLLM runs plain steps; with a cheap cost it drafts. Outputs
    stay the model's own either way."""
    greedy = tiny["greedy"]
    dear = run(tiny["folder"], tiny["prompts_file"], tmp_path / "dear.json", "--mode", "sbd",
               "--override", "sbd_cost_slope=10", "--override", "sbd_lookup=true")
    assert dear["tokens"] == greedy
    st = dear["stats"]
    probes = st["steps"] // 16 + 2 * len(greedy)  # DraftOptions.probe_every, per request
    assert st["lookup_drafts"] + st["mask_drafts"] <= probes, st
    assert st["empty_drafts"] >= 0.85 * st["steps"], st  # plain steps for (nearly) every request
    # one decision per engine step (8 requests at once): plain engine steps bar one probe step in 16
    assert st["engine_steps"] - st["plain_engine_steps"] <= st["engine_steps"] // 16 + 1, st
    cheap = run(tiny["folder"], tiny["prompts_file"], tmp_path / "cheap.json", "--mode", "sbd",
                "--override", "sbd_cost_slope=0.0", "--override", "sbd_lookup=true")
    assert cheap["tokens"] == greedy
    assert cheap["stats"]["mask_drafts"] + cheap["stats"]["lookup_drafts"] > cheap["stats"]["steps"] // 2


def test_step_cost_model():
    """The online cost model: the prior until a width is measured, medians, interpolation, batch scaling."""
    from sbd.decoding.width_cost import StepCost

    c = StepCost(prior_slope=0.05)
    assert c.for_batch(1)(1) == 1.0 and abs(c.for_batch(1)(9) - 1.4) < 1e-9
    for t in (0.050, 0.060, 0.055):
        c.add(1, t)
    for t in (0.090, 0.088, 0.500):  # an outlier: the median ignores it
        c.add(9, t)
    assert c.time(1) == 0.055 and c.time(9) == 0.090
    assert abs(c.time(5) - (0.055 + 0.035 / 2)) < 1e-12
    assert abs(c.for_batch(1)(9) - 0.090 / 0.055) < 1e-12
    # batch 4: width 12 for one request = total 15 (extrapolated from 9 with the prior's slope)
    assert c.for_batch(4)(12) > c.for_batch(1)(12)
    # a batch size near a measured width reads it (no plain step to measure it); one far away does not
    assert c.near(9) and c.near(8) and c.near(11) and not c.near(4) and not c.near(30) and c.near(1)
    # forwards with masks (eager) are timed apart: read from the plain record until measured, then their own
    g = StepCost(prior_slope=0.05, fallback=c)
    assert g.time(9) == c.time(9) and c.for_batch(1, g)(9) == c.for_batch(1)(9)
    for t in (0.120, 0.118, 0.125):
        g.add(9, t)
    assert g.time(9) == 0.120 and c.time(9) == 0.090
    assert abs(c.for_batch(1, g)(9) - 0.120 / 0.055) < 1e-12  # against the plain step's time


def test_prefix_cache_never_keeps_a_mask(tiny, tmp_path):
    """Prompts that extend the first pass's outputs hit prefix-cache blocks written while masks were in
    flight (rolled back): their outputs are still the model's own."""
    more = [p + g[:40] for p, g in zip(tiny["prompts"], tiny["greedy"])]
    more_file = tmp_path / "more.json"
    more_file.write_text(json.dumps(more))
    want = hf_reference.greedy(tiny["folder"], more, MAX_TOKENS)
    got = run(tiny["folder"], tiny["prompts_file"], tmp_path / "pc.json", "--mode", "sbd", "--prefix-caching",
              "--block-size", "32", "--then", str(more_file))
    assert got["tokens"] == tiny["greedy"]
    assert got["then"] == want
    assert got["prefix_cache_hits"] > 0


def test_preempted_mid_draft_leaves_no_trace(tiny, tmp_path):
    """A KV cache too small for the 8 requests at once (6 blocks of 32 tokens): vLLM preempts requests
    while their masks are in flight (every step drafts masks) and recomputes them later. Every output is
    still the model's own greedy answer, so neither the preempted request nor the others kept anything of
    the masks."""
    got = run(tiny["folder"], tiny["prompts_file"], tmp_path / "pre.json", "--mode", "sbd", "--block-size", "32",
              "--kv-blocks", "6", "--max-model-len", "128", "--override", "sbd_lookup=false",
              "--override", 'sbd_draft="block"')
    assert got["preemptions"] > 0, got["spec"]
    assert got["stats"]["mask_drafts"] > 0
    assert got["tokens"] == tiny["greedy"]


def test_sampling_is_the_models_distribution(tiny, tmp_path):
    """Sampled with sbd's drafts: no mask token ever comes out, and the tokens follow the model's own
    distribution (z-test against exact probabilities; |z| <= 4)."""
    prompts = [tiny["prompts"][i % 3] for i in range(48)]
    prompts_file = tmp_path / "sampled_prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    got = run(tiny["folder"], prompts_file, tmp_path / "sampled.json", "--mode", "sbd", "--temperature", "0.5",
              "--override", "sbd_lookup=true")
    n, masks, z = hf_sampling_check.z_score(tiny["folder"], prompts, got["tokens"], 0.5)
    assert n == 48 * MAX_TOKENS and masks == 0
    assert abs(z) <= 4, z
