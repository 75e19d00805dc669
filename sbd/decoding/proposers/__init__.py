"""Drafters for sbd-verify, one per file, each behind the same small interface: `propose(...)` returns
the draft as a host list of token ids (the masks' chain and a tree's branches are read from the values a
row asked the device for; prompt lookup reads the committed tokens). How long a draft is, and which
source drafts, is the policy's (`sbd.decoding.draft_policy`), never the drafter's.

- `chain`: the masks' chain (their argmax, or the sampler head's re-ranking), and the leftover of a
  refused draft;
- `head`: the sampler head's re-ranking of the masks' candidates into a chain;
- `lookup`: prompt lookup (a scan, and an index over a growing sequence);
- `tree`: a tree draft's branches from the masks' top candidates.
"""
