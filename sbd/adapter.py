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
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from .errors import SBDError

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_TYPE = "SBD_GATED_LORA"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PREFIX = "base_model.model."
_MASK_KEY = "sbd_mask_embedding"
KEY_PREFIX, MASK_KEY = _PREFIX, _MASK_KEY  # the tensor names, for readers of the file (the vLLM plug-in)


@dataclass
class AdapterConfig:
    """What an adapter is: rank, scale, the layers it targets, and what decoding needs to use it."""

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
        a, b = self.update_of(name)
        return (x @ a.t().to(x.dtype)) @ b.t().to(x.dtype) * self.scaling


def _key(name: str) -> str:
    return name.replace(".", "__")  # ParameterDict keys cannot hold dots


def _linear_hook(adapter: DraftingAdapter, name: str):
    key = _key(name)

    def hook(module, args, output):
        s = adapter.start
        if s is None:
            return output
        if isinstance(s, torch.Tensor):  # one start per row
            return output + adapter.delta(name, args[0]) * _row_gate(s, output)
        if s >= output.shape[-2]:
            return output
        x = args[0]
        a, b = adapter.lora_A[key], adapter.lora_B[key]  # looked up each time: wrappers may replace them
        if not torch.is_grad_enabled() and output.dim() == 3 and x.dtype == output.dtype == a.dtype:
            # decoding: one fused multiply-add into the block's rows, no copy of the whole output.
            # A hook runs on every targeted layer of every forward (210 on SmolLM2), so its few small
            # products cost more in dispatch than in arithmetic: one row of a batch is one 2-D addmm.
            if output.shape[0] == 1 and output.is_contiguous() and x.is_contiguous():
                rows = output.view(-1, output.shape[-1])[s:]
                rows.addmm_(torch.mm(x.view(-1, x.shape[-1])[s:], a.t()), b.t(), alpha=adapter.scaling)
                return output
            block = output[:, s:, :]
            block.baddbmm_(x[:, s:, :] @ a.t(), b.t().expand(output.shape[0], -1, -1), alpha=adapter.scaling)
            return output
        if s == 0:
            return output + adapter.delta(name, x)
        delta = adapter.delta(name, x[..., s:, :])
        return torch.cat([output[..., :s, :], output[..., s:, :] + delta], dim=-2)
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
             if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in set(names) and not n.startswith("sbd_adapter")}
    if not found:
        raise SBDError(f"none of the adapter's target modules ({', '.join(names)}) is a linear layer of "
                       f"{type(model).__name__}")
    return found


def adapter_of(model) -> DraftingAdapter | None:
    """The drafting adapter attached to `model`, if any."""
    return getattr(model, "sbd_adapter", None)


def attach(model, config: AdapterConfig) -> DraftingAdapter:
    """Attach a fresh (zero-update) adapter to `model` in place and return it. The model's own weights
    are not touched; train with `model.requires_grad_(False)` first so that only the adapter learns."""
    if adapter_of(model) is not None:
        raise SBDError("this model already has a drafting adapter attached")
    mask_id = getattr(model.config, "sbd_mask_token_id", None)
    if mask_id is None:
        raise SBDError("a drafting adapter needs the model's SBD mask token; call sbd.add_mask_token first")
    if config.mask_token_id < 0:
        config.mask_token_id = int(mask_id)
    if config.mask_token_id != int(mask_id):
        raise SBDError(f"the adapter was made for mask token id {config.mask_token_id}, the model's is {mask_id}")
    layers = _targets(model, config.target_modules)
    embedding = model.get_input_embeddings()
    adapter = DraftingAdapter(config, layers, embedding)
    model.sbd_adapter = adapter  # a submodule: moves with .to(), its parameters reach the optimizer
    for name, lin in layers.items():
        adapter._hooks.append(lin.register_forward_hook(_linear_hook(adapter, name)))
    adapter._hooks.append(embedding.register_forward_hook(_embedding_hook(adapter)))
    return adapter


def detach(model) -> None:
    """Remove the adapter and its hooks: the model is the plain model again."""
    adapter = adapter_of(model)
    if adapter is None:
        return
    for h in adapter._hooks:
        h.remove()
    del model.sbd_adapter


@contextlib.contextmanager
def gated(model, start: int | None):
    """Within the block, the adapter acts on positions >= `start` of each forward (None: off).
    A model without an adapter is unaffected."""
    adapter = adapter_of(model)
    if adapter is None:
        yield
        return
    previous, adapter.start = adapter.start, start
    try:
        yield
    finally:
        adapter.start = previous


def merge(model) -> None:
    """Always refused: the update acts on block positions only; merged into W it would act everywhere."""
    raise SBDError("a drafting adapter cannot be merged into the weights: it acts on block positions only, and "
                   "merged weights would change the model's own next-token predictions")


def save(model, folder, dtype: torch.dtype = torch.float32) -> Path:
    """Write `adapter_config.json` and `adapter_model.safetensors` (peft's layout) into `folder`;
    `dtype` of the stored tensors (bfloat16 halves the file; loading casts to the model's dtype)."""
    from safetensors.torch import save_file

    adapter = adapter_of(model)
    if adapter is None:
        raise SBDError("this model has no drafting adapter to save")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name in adapter.names:
        tensors[f"{_PREFIX}{name}.lora_A.weight"] = adapter.lora_A[_key(name)].detach().to(dtype).cpu().contiguous()
        tensors[f"{_PREFIX}{name}.lora_B.weight"] = adapter.lora_B[_key(name)].detach().to(dtype).cpu().contiguous()
    embed = next(n for n, m in model.named_modules() if m is model.get_input_embeddings())
    tensors[f"{_PREFIX}{embed}.{_MASK_KEY}"] = adapter.mask_embedding.detach().to(dtype).cpu().contiguous()
    save_file(tensors, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    (folder / CONFIG_NAME).write_text(json.dumps(asdict(adapter.config), indent=1))
    return folder


def read_config(folder) -> AdapterConfig:
    """The config of the adapter in `folder`; SBDError for a folder that holds none or another kind."""
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise SBDError(f"{str(folder)!r} holds no drafting adapter (no {CONFIG_NAME})")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SBDError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict) or raw.get("peft_type") != ADAPTER_TYPE:
        kind = raw.get("peft_type") if isinstance(raw, dict) else None
        raise SBDError(f"{path} describes a {kind!r} adapter, not an sbd drafting adapter ({ADAPTER_TYPE}); an "
                       "ordinary LoRA acts on every position and would change the model's own answers")
    known = {f for f in AdapterConfig.__dataclass_fields__}
    return AdapterConfig(**{k: v for k, v in raw.items() if k in known})


def read_tensors(path: Path, missing: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file of a drafter's folder; SBDError `missing` when it is absent, one
    line when it is damaged (shared by the adapter and the sampler head)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise SBDError(missing)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise SBDError(f"{path} is damaged or unreadable ({e})") from None


def load_weights(model, folder) -> None:
    """Copy the tensors saved in `folder` into the adapter already attached to `model` (same parameter
    objects, so an optimizer that holds them keeps working: this is how a training run resumes)."""
    adapter = adapter_of(model)
    weights = Path(folder) / WEIGHTS_NAME
    tensors = read_tensors(weights, f"{str(folder)!r} has no {WEIGHTS_NAME}")
    pairs = []
    for name in adapter.names:
        for part, store in (("lora_A", adapter.lora_A), ("lora_B", adapter.lora_B)):
            key = f"{_PREFIX}{name}.{part}.weight"
            if key not in tensors:
                raise SBDError(f"{weights} lacks {key}: the adapter was made for another model")
            pairs.append((store[_key(name)], tensors[key], f"{name}.{part}"))
    mask = [t for k, t in tensors.items() if k.endswith("." + _MASK_KEY)]
    if len(mask) != 1:
        raise SBDError(f"{weights} holds no mask embedding")
    pairs.append((adapter.mask_embedding, mask[0], "mask embedding"))
    for param, saved, what in pairs:
        if saved.shape != param.shape:
            raise SBDError(f"{weights}: {what} has shape {tuple(saved.shape)}, the model needs {tuple(param.shape)}: "
                           "the adapter was made for another model")
    with torch.no_grad():
        for param, saved, _ in pairs:
            param.copy_(saved)


def load(model, folder) -> DraftingAdapter:
    """Attach the adapter saved in `folder` to `model` (in place) and return it."""
    config = read_config(folder)
    if not (Path(folder) / WEIGHTS_NAME).is_file():
        raise SBDError(f"{str(folder)!r} has {CONFIG_NAME} but no {WEIGHTS_NAME}")
    adapter = attach(model, config)
    try:
        load_weights(model, folder)
    except SBDError:
        detach(model)
        raise
    return adapter


def is_adapter_folder(folder) -> bool:
    return (Path(folder) / CONFIG_NAME).is_file() and not (Path(folder) / "config.json").is_file()
