"""The drafting adapter: low-rank updates over a frozen model that act on block positions only.

Each targeted linear layer computes `W x + g_t · (alpha / r) · B A x`, with the gate `g_t` 1 on block
positions (the masked copy in training; the block of an SBD forward; the masks of sbd-verify) and 0 on
every causal position. The model's next-token logits and every key/value that enters the KV cache are
therefore the frozen model's own, so sbd-verify with the adapter gives the original model's tokens.
An adapter-owned embedding replaces the mask token's embedding at gated positions.

The gate is "positions at or after `start` within this forward" (every forward sbd makes puts the
block after its causal part; `start` may also be one column per row, a (B,) tensor, when the rows of
a batch are at different stages): `start = None` switches the adapter off, which is the state outside of
`gated(...)`, so any other caller of the model (Hugging Face `generate`, log-likelihoods) sees the
unchanged model.

Files follow peft's layout (`adapter_config.json` + `adapter_model.safetensors`, `lora_A`/`lora_B`
tensors under `base_model.model.<module>`), but the config names its own type: peft would attach the
tensors as an ordinary LoRA acting on every position, which changes the model's answers, so it refuses
the type instead. An adapter cannot be merged into the weights for the same reason (`merge`).

The update itself is `gated.gated_update`, which the vLLM plug-in calls too; `read` gives the saved
folder to a reader that attaches it its own way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..errors import SBDError
from . import folder as files
from .attach import Slot, setting
from .config import DrafterConfig
from .gated import gated_update, low_rank

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_TYPE = "SBD_GATED_LORA"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PREFIX = "base_model.model."
_MASK_KEY = "sbd_mask_embedding"
SLOT = Slot("sbd_adapter", "drafting adapter")


@dataclass
class AdapterConfig(DrafterConfig):
    """What an adapter is: rank, scale, the layers it targets, and what decoding needs to use it."""

    FILE = CONFIG_NAME
    KIND_KEY, KIND = "peft_type", ADAPTER_TYPE
    MISSING = "{folder!r} holds no drafting adapter (no " + CONFIG_NAME + ")"
    OTHER_KIND = ("{path} describes a {kind!r} adapter, not an sbd drafting adapter (" + ADAPTER_TYPE + "); an "
                  "ordinary LoRA acts on every position and would change the model's own answers")

    r: int = 16
    lora_alpha: float = 32.0
    target_modules: list = field(default_factory=lambda: list(DEFAULT_TARGETS))
    mask_token_id: int = -1
    block_size: int = 16  # the block size it was trained for: the default of generate, demo and CLI
    base_model_name_or_path: str = ""
    peft_type: str = ADAPTER_TYPE
    gate: str = "block positions only (1 on block/mask positions, 0 on every causal position)"
    # the fastest exact greedy sbd-verify configuration measured with this adapter (draft, lookup,
    # lookup_max, tree): the defaults of generate, the CLI, the server and lm-eval (sbd.decoding.defaults)
    decoding: dict | None = None
    # the decodings it was trained for (sbd.decoding.trained_for): every block position masked in training
    # fits sbd-verify's drafts; partially revealed blocks also fit plain SBD. Adapters written before this
    # field were all trained with every position masked.
    trained_for: list = field(default_factory=lambda: ["sbd-verify"])

    def __post_init__(self):
        if not isinstance(self.r, int) or self.r < 1:
            raise SBDError(f"adapter rank must be an integer >= 1, got {self.r!r}")
        if not isinstance(self.lora_alpha, (int, float)) or not math.isfinite(self.lora_alpha) or self.lora_alpha <= 0:
            raise SBDError(f"adapter alpha must be a positive number, got {self.lora_alpha!r}")
        if not self.target_modules:
            raise SBDError("an adapter needs at least one target module")
        if not isinstance(self.trained_for, list) or any(d not in ("sbd", "sbd-verify") for d in self.trained_for):
            raise SBDError(f"an adapter's trained_for lists decodings among sbd, sbd-verify; got {self.trained_for!r}")


class DraftingAdapter(nn.Module):
    """The adapter's parameters and its gate; attached to a model as `model.sbd_adapter` by `attach`.

    Parameters live here (not inside the model's linear layers), so the model's own state dict and
    modules are untouched; forward hooks on the targeted layers add the gated update.
    """

    def __init__(self, config: AdapterConfig, layers: dict[str, nn.Linear], embedding: nn.Embedding):
        super().__init__()
        self.config = config
        self.scaling = config.lora_alpha / config.r
        self.start: int | torch.Tensor | None = None  # the gate: None = off; s = positions >= s (per row: (B,))
        self.names = sorted(layers)
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        for name in self.names:
            lin = layers[name]
            a = torch.empty(config.r, lin.in_features, dtype=lin.weight.dtype, device=lin.weight.device)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # as peft: A random, B zero, so the update starts at 0
            self.lora_A[_key(name)] = nn.Parameter(a)
            self.lora_B[_key(name)] = nn.Parameter(torch.zeros(lin.out_features, config.r, dtype=lin.weight.dtype,
                                                               device=lin.weight.device))
        self.mask_embedding = nn.Parameter(embedding.weight[config.mask_token_id].detach().clone())
        self._hooks = []

    def update_of(self, name: str) -> tuple[nn.Parameter, nn.Parameter]:
        """(A, B) of the targeted layer `name` (a module name of the model)."""
        return self.lora_A[_key(name)], self.lora_B[_key(name)]

    def delta(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """The ungated update of layer `name` at every position of x."""
        a, b = self.update_of(name)
        return low_rank(x, a.t(), b.t()) * self.scaling


def _key(name: str) -> str:
    return name.replace(".", "__")  # ParameterDict keys cannot hold dots


def gate_output(adapter: DraftingAdapter, key: str, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """The output of targeted layer `key` (`_key` of its name) for input x with the gated update added:
    what its hook returns, and what the engine's own forward (`sbd.decoding.llama_forward`) calls."""
    s = adapter.start
    if s is None or (not isinstance(s, torch.Tensor) and s >= output.shape[-2]):
        return output  # a plain forward, or a block that starts past this one: nothing to add
    a, b = adapter.lora_A[key], adapter.lora_B[key]  # looked up each time: wrappers may replace them
    if isinstance(s, torch.Tensor):  # one start per row
        return gated_update(output, x, a.t(), b.t(), adapter.scaling, per_row=_row_gate(s, output))
    return gated_update(output, x, a.t(), b.t(), adapter.scaling, start=s)


def layer_keys(adapter: DraftingAdapter, model) -> dict[int, str]:
    """{id(module): key} of the layers of `model` the adapter targets."""
    names = set(adapter.names)
    return {id(m): _key(n) for n, m in model.named_modules() if n in names}


def _linear_hook(adapter: DraftingAdapter, name: str):
    key = _key(name)

    def hook(module, args, output):
        return gate_output(adapter, key, args[0], output)
    return hook


def _embedding_hook(adapter: DraftingAdapter):
    mask_id = adapter.config.mask_token_id

    def hook(module, args, output):
        if adapter.start is None:
            return output
        s = adapter.start
        if isinstance(s, torch.Tensor):  # one start per row
            hit = (args[0] == mask_id) & _row_gate(s, output)[..., 0].bool()
            return torch.where(hit[..., None], adapter.mask_embedding.to(output.dtype), output)
        hit = args[0][..., s:] == mask_id  # mask tokens only ever stand in the gated part
        block = torch.where(hit[..., None], adapter.mask_embedding.to(output.dtype), output[..., s:, :])
        return block if s == 0 else torch.cat([output[..., :s, :], block], dim=-2)
    return hook


def _row_gate(starts: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """(B, q, 1) gate, 1 at columns >= the row's start."""
    cols = torch.arange(output.shape[-2], device=output.device)
    return (cols[None] >= starts[:, None]).to(output.dtype)[..., None]


def _targets(model, names) -> dict[str, nn.Linear]:
    found = {n: m for n, m in model.named_modules()
             if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in set(names) and not n.startswith(SLOT.attribute)}
    if not found:
        raise SBDError(f"none of the adapter's target modules ({', '.join(names)}) is a linear layer of "
                       f"{type(model).__name__}")
    return found


def adapter_of(model) -> DraftingAdapter | None:
    """The drafting adapter attached to `model`, if any."""
    return SLOT.of(model)


def attach(model, config: AdapterConfig) -> DraftingAdapter:
    """Attach a fresh (zero-update) adapter to `model` in place and return it. The model's own weights
    are not touched; train with `model.requires_grad_(False)` first so that only the adapter learns."""
    return _hang(model, _fresh(model, config))


def _fresh(model, config: AdapterConfig) -> DraftingAdapter:
    """A zero-update adapter over `model`'s layers, not attached yet (no hooks)."""
    SLOT.check_free(model)
    mask_id = getattr(model.config, "sbd_mask_token_id", None)
    if mask_id is None:
        raise SBDError("a drafting adapter needs the model's SBD mask token; call sbd.add_mask_token first")
    if config.mask_token_id < 0:
        config.mask_token_id = int(mask_id)
    if config.mask_token_id != int(mask_id):
        raise SBDError(f"the adapter was made for mask token id {config.mask_token_id}, the model's is {mask_id}")
    return DraftingAdapter(config, _targets(model, config.target_modules), model.get_input_embeddings())


def _hang(model, adapter: DraftingAdapter) -> DraftingAdapter:
    """Hang `adapter` on `model` and hook it into the layers it updates and the embedding."""
    SLOT.hang(model, adapter)
    modules = dict(model.named_modules())
    for name in adapter.names:
        adapter._hooks.append(modules[name].register_forward_hook(_linear_hook(adapter, name)))
    adapter._hooks.append(model.get_input_embeddings().register_forward_hook(_embedding_hook(adapter)))
    return adapter


def detach(model) -> None:
    """Remove the adapter and its hooks: the model is the plain model again."""
    adapter = SLOT.remove(model)
    if adapter is not None:
        for h in adapter._hooks:
            h.remove()


def gated(model, start: int | None):
    """Within the block, the adapter acts on positions >= `start` of each forward (None: off).
    A model without an adapter is unaffected."""
    return setting(adapter_of(model), "start", start)


def merge(model) -> None:
    """Always refused: the update acts on block positions only; merged into W it would act everywhere."""
    raise SBDError("a drafting adapter cannot be merged into the weights: it acts on block positions only, and "
                   "merged weights would change the model's own next-token predictions")


def save(model, folder, dtype: torch.dtype = torch.float32) -> Path:
    """Write `adapter_config.json` and `adapter_model.safetensors` (peft's layout) into `folder`;
    `dtype` of the stored tensors (bfloat16 halves the file; loading casts to the model's dtype)."""
    adapter = SLOT.require(model, "to save")
    tensors = {}
    for name in adapter.names:
        tensors[_tensor_name(name, "lora_A")] = adapter.lora_A[_key(name)]
        tensors[_tensor_name(name, "lora_B")] = adapter.lora_B[_key(name)]
    embed = next(n for n, m in model.named_modules() if m is model.get_input_embeddings())
    tensors[f"{_PREFIX}{embed}.{_MASK_KEY}"] = adapter.mask_embedding
    return files.save(folder, adapter.config, tensors, WEIGHTS_NAME, dtype)


def _tensor_name(name: str, part: str) -> str:
    """The stored name of layer `name`'s `part` ("lora_A" / "lora_B"), as peft writes it."""
    return f"{_PREFIX}{name}.{part}.weight"


def read_config(folder) -> AdapterConfig:
    """The config of the adapter in `folder`; SBDError for a folder that holds none or another kind."""
    return AdapterConfig.read(folder)


@dataclass
class SavedAdapter:
    """An adapter folder as stored, for a reader that attaches it its own way (the vLLM plug-in):
    the config, the weights file, and the updates by the module names of the Hugging Face model."""

    config: AdapterConfig
    path: Path
    tensors: dict[str, torch.Tensor]
    mask_embedding: torch.Tensor

    def update(self, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(A (r, in), B (out, r)) of module `name`, None when the file holds no update for it."""
        a, b = self.tensors.get(_tensor_name(name, "lora_A")), self.tensors.get(_tensor_name(name, "lora_B"))
        return None if a is None or b is None else (a, b)


def _read_weights(folder, missing: str) -> tuple[Path, dict[str, torch.Tensor], torch.Tensor]:
    path = Path(folder) / WEIGHTS_NAME
    tensors = files.read_tensors(path, missing)
    mask = [t for k, t in tensors.items() if k.endswith("." + _MASK_KEY)]
    if len(mask) != 1:
        raise SBDError(f"{path} holds no mask embedding")
    return path, tensors, mask[0]


def read(folder) -> SavedAdapter:
    """The adapter saved in `folder`, not attached to anything."""
    config = read_config(folder)
    return SavedAdapter(config, *_read_weights(folder, f"{str(folder)!r} has {CONFIG_NAME} but no {WEIGHTS_NAME}"))


def load_weights(model, folder) -> None:
    """Copy the tensors saved in `folder` into the adapter already attached to `model` (same parameter
    objects, so an optimizer that holds them keeps working: this is how a training run resumes)."""
    _fill(adapter_of(model), folder, f"{str(folder)!r} has no {WEIGHTS_NAME}")


def _fill(adapter: DraftingAdapter, folder, missing: str) -> None:
    weights, tensors, mask = _read_weights(folder, missing)
    pairs = []
    for name in adapter.names:
        for part, store in (("lora_A", adapter.lora_A), ("lora_B", adapter.lora_B)):
            key = _tensor_name(name, part)
            if key not in tensors:
                raise SBDError(f"{weights} lacks {key}: the adapter was made for another model")
            pairs.append((store[_key(name)], tensors[key], f"{name}.{part}"))
    pairs.append((adapter.mask_embedding, mask, "mask embedding"))
    for param, saved, what in pairs:
        if saved.shape != param.shape:
            raise SBDError(f"{weights}: {what} has shape {tuple(saved.shape)}, the model needs {tuple(param.shape)}: "
                           "the adapter was made for another model")
    files.copy_into((param, saved) for param, saved, _ in pairs)


def load(model, folder) -> DraftingAdapter:
    """Attach the adapter saved in `folder` to `model` (in place) and return it; one that does not fit
    leaves the model as it was (filled before it hangs)."""
    adapter = _fresh(model, read_config(folder))
    _fill(adapter, folder, f"{str(folder)!r} has {CONFIG_NAME} but no {WEIGHTS_NAME}")
    return _hang(model, adapter)


def base_model(folder) -> str | None:
    """The base model the adapter in `folder` was made for, as its config records it (a folder or a
    shipped name; None when it names none); SBDError for a folder that holds no adapter."""
    return read_config(folder).base_model_name_or_path


def is_adapter_folder(folder) -> bool:
    return (Path(folder) / CONFIG_NAME).is_file() and not (Path(folder) / "config.json").is_file()
