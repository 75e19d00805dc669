"""Drafters for sbd-verify, one per file, each behind the one interface of `base` (`Drafter`: `values` on the
device from a verifying forward, `propose` on the host from those values and the committed tokens; `source`
names the record that prices its drafts). sbd's rows (`sbd.decoding.rows`, `sbd.decoding.tree_rows`) and the
vLLM proposer (`sbd.integrations.vllm.proposer`) hold the same drafter objects. How long a draft is, and
which source drafts, is the policy's (`sbd.decoding.draft_policy`), never the drafter's.

- `chain`: the masks' chain (`MaskChain`: their argmax), and the leftover of a refused draft;
- `head`: the sampler head's chain (`HeadChain`: the masks' candidates re-ranked, each given the token
  chosen before it);
- `lookup`: prompt lookup (`LookupIndex` over a growing sequence, and the scan `draft`);
- `tree`: a tree draft's branches from the masks' top candidates (`TreeBranches`);
- `eb`: a draft revealed by the EB rule over forwards of its own (`EBReveal`).
"""
