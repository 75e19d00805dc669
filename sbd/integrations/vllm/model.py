"""vLLM model classes that carry sbd's drafting adapter: the plain model everywhere except at the masks.

`SBDDrafting` is mixed into vLLM's own Llama / Mistral / Qwen2 / Qwen3 classes. Three things differ from
the plain class, and none of them touches a committed position, so vLLM's outputs stay its own:

1. Gate. The adapter's low-rank updates `(alpha/r) B A x` and its mask embedding act on the gated rows
   only: the trailing mask tokens among the speculative tokens vLLM scheduled for a request this step
   (`InputBatch.spec_token_ids`, which only our proposer fills). A prompt token, the sampled token or a
   draft token is never gated, even when it happens to be the mask id. The proposer hands the model a
   view of the runner's batch (`sbd_bind`); until it does (no speculation), nothing is ever gated.
2. Logits. `compute_logits` sets the mask token's logit to -inf on every row: vLLM never samples it,
   never gives it a logprob, and its rejection sampler always refuses a mask drafted as a speculative
   token, so the masks' KV is rolled back (`num_computed_tokens -= num_rejected`) and never reaches the
   prefix cache (only `request.num_tokens` tokens are ever hashed).
3. Stash. The final hidden states of the gated rows and their logits from vLLM's own `compute_logits`
   pass (no second lm_head pass) stay on the model (`sbd_take_stash`) for the proposer, which runs in
   the same worker process right after this step's sampling.

Compilation: every forward, with masks or without, runs vLLM's own compiled graph (and, on a GPU, its
CUDA graphs). The updates are hooks attached at load, before vLLM traces its graph, that read this step's
mask rows from persistent buffers the model writes before each forward (`gate.py`: the gate, its two
paths, what a plain step pays). Forwards that ran eagerly while vLLM compiles are counted
(`sbd_eager_forwards`; the tests require none). vLLM's compile cache holds the graph with the adapter's
shapes: the adapter's digest goes into vLLM's `additional_config`, which vLLM hashes into the cache key, so
another adapter never reuses it. Setting `sbd_gate_path` ("dense" / "op") picks the path.
Tensor parallelism is not supported (the updates are not sharded).

The adapter and its sampler head are read with sbd's own readers (`sbd.drafters`), and the update is
`sbd.drafters.gated.gated_update`, as in sbd's Hugging Face path.

Adapter location: the model folder's config key `sbd_adapter` (a path, relative to the folder or
absolute; settable with `hf_overrides`), else the sub-folder `sbd_adapter/` when it exists. Without an
adapter the class is the plain model with the mask logit at -inf (the proposer then drafts by lookup
only). A sampler head saved beside the adapter is loaded too (`sbd_sampler_head: false` skips it).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from sbd.integrations.vllm.gate import Gate
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

logger = logging.getLogger("vllm.sbd")  # under "vllm": vLLM's own handler prints it

ADAPTER_DIR = "sbd_adapter"
# vLLM's fused linear layers and the Hugging Face module names they stack, in output order
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"),
          "o_proj": ("o_proj",), "down_proj": ("down_proj",)}


@dataclass
class Stash:
    """What one forward's gated rows produced, for the proposer. segments: one per request with masks,
    (batch index, request id, draft tokens before its masks, first chain row, masks): the chain rows are
    masks 2..m (the first mask sits where the bonus token goes; its output drafts nothing), m − 1 rows
    per request, requests in batch order. hidden: (chain rows, H), their final (normed) hidden states
    (the sampler head reads them); logits: (chain rows, V), their logits as `compute_logits` computed them
    for vLLM's sampler (mask column -inf), taken from that one pass; None until it ran.
    logit_rows / n_logits: where the chain rows sit among `compute_logits`' rows, and how many it gets."""

    segments: list[tuple[int, str, int, int, int]]
    hidden: torch.Tensor
    logit_rows: torch.Tensor
    n_logits: int
    logits: torch.Tensor | None = None


class _Tables:
    """The two tables `sbd.drafters.sampler_head.draft_table` reads, from vLLM's embedding and output layers."""

    def __init__(self, model):
        self._model = model

    def get_input_embeddings(self):
        return self._model.model.embed_tokens

    def get_output_embeddings(self):
        return self._model.lm_head


class SBDDrafting:
    """Mixed in before a vLLM `*ForCausalLM` class (see the module docstring)."""

    def _sbd_init(self, vllm_config) -> None:
        cfg = vllm_config.model_config.hf_config
        mask_id = getattr(cfg, "sbd_mask_token_id", None)
        if mask_id is None:
            raise ValueError("the model's config has no sbd_mask_token_id: add the mask token with sbd first "
                             "(sbd import / sbd.add_mask_token)")
        if vllm_config.parallel_config.tensor_parallel_size != 1:
            raise ValueError("sbd's vLLM plug-in supports tensor_parallel_size=1 only (the adapter is not sharded)")
        self.sbd_mask_id = int(mask_id)
        self._sbd_folder = Path(vllm_config.model_config.model)
        self._sbd_cfg = cfg
        self._sbd_vllm_config = vllm_config
        self._sbd_stash: Stash | None = None
        self._sbd_batch = None
        self.sbd_forwards = 0
        # one gate value per token slot of a forward; the graph reads the first num_tokens (vLLM never
        # schedules more than max_num_batched_tokens in one forward, speculative tokens included)
        embed = self.model.embed_tokens.weight
        self._sbd_gate_state = Gate(int(vllm_config.scheduler_config.max_num_batched_tokens), embed.dtype,
                                    embed.device, getattr(cfg, "sbd_gate_path", None))
        self.sbd_adapter_config = None
        self.sbd_head = None  # plain attributes, not submodules: vLLM checks every parameter was loaded

    # -- loading ----------------------------------------------------------------------------------
    def _sbd_adapter_folder(self) -> Path | None:
        named = getattr(self._sbd_cfg, "sbd_adapter", None)
        if named:
            path = Path(named)
            path = path if path.is_absolute() else self._sbd_folder / path
            if not path.is_dir():
                raise ValueError(f"sbd_adapter names {str(path)!r}, which is not a folder")
            return path
        path = self._sbd_folder / ADAPTER_DIR
        return path if path.is_dir() else None

    def load_weights(self, weights):
        loaded = super().load_weights(weights)
        folder = self._sbd_adapter_folder()
        if folder is not None:
            self._sbd_load_adapter(folder)
        return loaded

    def _sbd_load_adapter(self, folder: Path) -> None:
        from sbd.drafters import adapter as adapters
        from sbd.drafters import sampler_head as heads

        saved = adapters.read(folder)
        config = saved.config
        if config.mask_token_id != self.sbd_mask_id:
            raise ValueError(f"the adapter in {folder} was made for mask token {config.mask_token_id}, the model's "
                             f"is {self.sbd_mask_id}")
        embed = self.model.embed_tokens.weight
        gate = self._sbd_gate_state
        gate.scale = config.lora_alpha / config.r
        updates = []
        for name, module in self.named_modules():
            parts = _FUSED.get(name.rsplit(".", 1)[-1])
            if parts is None or not hasattr(module, "weight"):
                continue
            base = name.rsplit(".", 1)[0]
            a_parts, b_parts = [], []
            sizes = _output_sizes(module, len(parts))
            for part, size in zip(parts, sizes):
                update = saved.update(f"{base}.{part}")
                if update is None:
                    if part in config.target_modules:
                        raise ValueError(f"{folder} lacks {base}.{part}: the adapter was made for another model")
                    update = (torch.zeros(config.r, module.weight.shape[1]),  # a layer it does not target: zero block
                              torch.zeros(size, config.r))
                a, b = update
                if b.shape[0] != size:
                    raise ValueError(f"{folder}: {base}.{part} has {b.shape[0]} outputs, the model {size}")
                a_parts.append(a.float())
                b_parts.append(b.float())
            if all(not b.any() for b in b_parts):
                continue
            updates.append((module, torch.cat(a_parts), torch.block_diag(*b_parts)))
        if not updates:
            raise ValueError(f"{folder}: none of the adapter's tensors fits a layer of {type(self).__name__}")
        gate.attach_embedding(self.model.embed_tokens, saved.mask_embedding)
        for module, a, b in updates:
            gate.attach_update(module, a, b)
        # vLLM keys its compile cache by its config's hash, which leaves hf_overrides (where sbd_adapter is
        # named) out; additional_config is in it: the adapter's digest keeps one adapter's graph from another
        digest = hashlib.sha256(saved.path.read_bytes()).hexdigest()[:16]
        self._sbd_vllm_config.additional_config["sbd_adapter"] = f"{digest}:{len(updates)}:r{config.r}:{gate.path}"
        self.sbd_adapter_config = config
        if heads.has_head(folder) and getattr(self._sbd_cfg, "sbd_sampler_head", True):
            head = heads.read(folder, dtype=torch.float32)
            if head.config.hidden_size != embed.shape[1]:
                raise ValueError(f"{folder}: the sampler head was made for hidden size {head.config.hidden_size}")
            object.__setattr__(self, "sbd_head", head.eval())  # not a submodule (see _sbd_init)
        logger.info("sbd: drafting adapter from %s on %d layers%s", folder, len(updates),
                    " with its sampler head" if self.sbd_head is not None else "")

    # -- the proposer's side ------------------------------------------------------------------------
    def sbd_bind(self, batch_view) -> None:
        """`batch_view()` -> (request ids, scheduled speculative tokens per request, query start locations
        (num_reqs + 1), the forward's input ids on the host or None), all in the order of this step's
        flattened batch. Set by the proposer."""
        self._sbd_batch = batch_view

    def sbd_take_stash(self) -> Stash | None:
        stash, self._sbd_stash = self._sbd_stash, None
        return stash

    def sbd_mask_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The masks' own logits for drafting (the mask token itself excluded), projected again: only a
        fallback, the proposer takes them from `compute_logits`' pass (`Stash.logits`)."""
        logits = super().compute_logits(hidden.to(self.model.embed_tokens.weight.dtype)).float()
        logits[:, self.sbd_mask_id] = torch.finfo(logits.dtype).min
        return logits

    def sbd_tables(self) -> _Tables:
        return _Tables(self)

    # -- the forward --------------------------------------------------------------------------------
    def _sbd_gate(self, input_ids: torch.Tensor | None):
        """(rows, chain rows, stash layout) of this forward's gated rows, or None."""
        if self._sbd_batch is None or self.sbd_adapter_config is None or input_ids is None:
            return None
        req_ids, specs, qsl, ids_cpu = self._sbd_batch()
        if not any(specs):  # no speculative tokens this step: a plain forward
            return None
        mask, rows, chain, logit_rows, segments, n_logits = self.sbd_mask_id, [], [], [], [], 0
        for i, spec in enumerate(specs):
            n = len(spec)
            n_logits += n + 1  # vLLM takes logits at every draft row and the bonus row (1 without drafts)
            m = 0
            while m < n and spec[n - 1 - m] == mask:
                m += 1
            if m == 0:
                continue
            end = int(qsl[i + 1])
            segments.append((i, req_ids[i], n - m, len(chain), m))
            rows.extend(range(end - m, end))
            chain.extend(range(end - m + 1, end))
            logit_rows.extend(range(n_logits - m + 1, n_logits))
        if not rows:
            return None
        if max(rows) >= self._sbd_gate_state.slots:
            raise RuntimeError(f"sbd: a forward of more than {self._sbd_gate_state.slots} tokens "
                               "(max_num_batched_tokens) reached the model")
        device = input_ids.device
        index = torch.tensor(rows, dtype=torch.long)
        ids = ids_cpu if ids_cpu is not None else input_ids.cpu()  # the runner's host copy: no device sync
        if not bool((ids.index_select(0, index) == mask).all()):
            logger.warning("sbd: the batch layout does not match the scheduled masks; gate left off this step")
            return None
        return (index.to(device), torch.tensor(chain, dtype=torch.long, device=device), segments,
                torch.tensor(logit_rows, dtype=torch.long, device=device), n_logits)

    def sbd_eager_forwards(self) -> int:
        """Forwards of the inner model that ran eagerly (Python), not as vLLM's compiled graph: all of them
        under enforce_eager, none while vLLM compiles (0 without an adapter: nothing counts them)."""
        return int(getattr(self.model.embed_tokens, "sbd_eager_calls", 0))

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        self._sbd_stash = None
        self.sbd_forwards += 1
        gate = self._sbd_gate(input_ids)
        if gate is None:
            self._sbd_gate_state.open(None)
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        rows, chain, segments, logit_rows, n_logits = gate
        self._sbd_gate_state.open(rows)
        if inputs_embeds is not None:  # given embeddings skip the embedding layer (and its hook)
            inputs_embeds[rows] = self.model.embed_tokens.sbd_mask_embedding
        hidden = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        if isinstance(hidden, torch.Tensor):
            self._sbd_stash = Stash(segments, hidden.index_select(0, chain), logit_rows, n_logits)
        return hidden

    def compute_logits(self, hidden_states):
        logits = super().compute_logits(hidden_states)
        if logits is not None:
            logits[:, self.sbd_mask_id] = float("-inf")
            stash = self._sbd_stash
            if stash is not None and stash.logits is None and logits.shape[0] == stash.n_logits:
                # the masks' drafting logits, from vLLM's own pass (a copy: the sampler may scale in place)
                stash.logits = logits.index_select(0, stash.logit_rows)
        return logits


def _output_sizes(module, n: int) -> list[int]:
    """The output width of each stacked part of a fused vLLM linear layer (TP = 1)."""
    if n == 1:
        return [module.weight.shape[0]]
    if hasattr(module, "output_sizes"):  # MergedColumnParallelLinear, QKVParallelLinear
        return list(module.output_sizes)
    raise ValueError(f"cannot split the outputs of {type(module).__name__}")


class SBDLlamaForCausalLM(SBDDrafting, LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self._sbd_init(vllm_config)


class SBDMistralForCausalLM(SBDDrafting, MistralForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self._sbd_init(vllm_config)


class SBDQwen2ForCausalLM(SBDDrafting, Qwen2ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._sbd_init(vllm_config)


class SBDQwen3ForCausalLM(SBDDrafting, Qwen3ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self._sbd_init(vllm_config)
