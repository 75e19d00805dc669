"""sbd-verify's defaults (SPEC §7 "Defaults"): the fastest exact greedy configuration measured for the
loaded model, in one place. `sbd.decoding.spec.DecodeSpec.resolve`, which `sbd.generate`, `sbd generate`,
`sbd serve` and the lm-eval model all go through, reads them for every setting the user left out (None),
so they never disagree.

Where a model's measured configuration lives: a drafting adapter records it in its `adapter_config.json`
(`"decoding": {...}`), a fully fine-tuned SBD model in its `config.json` (`"sbd_decoding": {...}`), each
written from a benchmark whose command the model card gives. A model that records none gets `GENERAL`:
whole-block drafts, whose forwards do not depend on this machine's timings (adaptive widths do: they follow
the measured cost of a wide forward), for a model whose drafting nobody has measured yet.

Which settings have a default: `draft` ("block" or "adaptive"), `lookup`, `lookup_max`, `tree` and, for
adaptive drafts, `first_draft` ("block": a row's first draft is a whole block; "priced": priced on the prior
like every later one); a fully fine-tuned model may also record its `block_size` (an adapter's is the size
it was trained for).
Greedy only: with sampling (temperature > 0), or for methods other than sbd-verify, every left-out
setting is the plain one (whole-block drafts, no lookup, a chain), which is what stays exact there.
Every setting stays available to switch off: draft="block", lookup=False, tree="chain".
"""

from __future__ import annotations

from dataclasses import dataclass
from ..errors import SBDError
from .draft_policy import LOOKUP_MAX
from .trees import check_shape

CHAIN_WORDS = ("chain", "none", "off")  # what a user writes to turn tree drafts off


@dataclass(frozen=True)
class VerifySettings:
    """How sbd-verify drafts: whole blocks or adaptive lengths, prompt lookup and its longest draft, and
    the tree's widths per depth (None: one chain)."""

    draft: str = "block"
    lookup: bool = False
    lookup_max: int = LOOKUP_MAX
    tree: tuple[int, ...] | None = None
    # whole-block drafts that step aside to plain next-token steps while the masks' drafts almost never
    # stand (`DraftOptions.fallback_alpha`): the default for masks that were never trained for drafting
    fallback: bool = False
    # adaptive drafts: a row's first draft priced on the prior like every later one ("first_draft": "priced")
    # rather than a whole block (`DraftOptions.price_first_draft`); worth it where answers are long enough
    # for the record to form (SmolLM2's), not for a model whose short answers would never draft at all
    price_first_draft: bool = False

    def describe(self) -> str:
        """One line for tables and logs, e.g. "adaptive drafts, lookup ≤ 16, tree 3,2"."""
        parts = [f"{self.draft} drafts"]
        parts.append(f"lookup ≤ {self.lookup_max}" if self.lookup else "no lookup")
        parts.append("tree " + ",".join(map(str, self.tree)) if self.tree else "chain")
        if self.fallback:
            parts.append("plain steps while drafts fail")
        if self.price_first_draft and self.draft == "adaptive":
            parts.append("first draft priced")
        return ", ".join(parts)

    def as_dict(self) -> dict:
        return {"draft": self.draft, "lookup": self.lookup, "lookup_max": self.lookup_max,
                "tree": list(self.tree) if self.tree else None,
                "first_draft": "priced" if self.price_first_draft else "block"}


GENERAL = VerifySettings()  # a model that records no measured configuration
UNTRAINED = VerifySettings(fallback=True)  # ... and whose masks were never trained for drafting
PLAIN = VerifySettings()  # sampling and the other methods: what stays exact there


def tree_setting(tree) -> tuple[int, ...] | None | str:
    """A user's `tree` → widths per depth, None for an explicit chain ("chain", "none", "off", (), []),
    or "default" when left out (None). SBDError in one line for anything else."""
    if tree is None:
        return "default"
    if isinstance(tree, str) and tree.strip().lower() in CHAIN_WORDS:
        return None
    if isinstance(tree, (list, tuple)) and len(tree) == 0:
        return None
    return check_shape(tree)


def from_record(record, where: str) -> VerifySettings:
    """The settings a model folder records (a dict of draft, lookup, lookup_max, tree); SBDError naming
    `where` when the record is not one."""
    if not isinstance(record, dict):
        raise SBDError(f"{where}: the recorded decoding defaults are not a JSON object")
    unknown = set(record) - {"draft", "lookup", "lookup_max", "tree", "block_size", "measured", "first_draft"}
    if unknown:
        raise SBDError(f"{where}: unknown decoding default(s) {', '.join(sorted(unknown))}")
    draft = record.get("draft", GENERAL.draft)
    lookup = record.get("lookup", GENERAL.lookup)
    lookup_max = record.get("lookup_max", GENERAL.lookup_max)
    if draft not in ("block", "adaptive"):
        raise SBDError(f"{where}: the default draft is 'block' or 'adaptive', got {draft!r}")
    if not isinstance(lookup, bool):
        raise SBDError(f"{where}: the default lookup is true or false, got {lookup!r}")
    if not isinstance(lookup_max, int) or isinstance(lookup_max, bool) or lookup_max < 1:
        raise SBDError(f"{where}: the default lookup_max is an integer >= 1, got {lookup_max!r}")
    first = record.get("first_draft", "block")
    if first not in ("block", "priced"):
        raise SBDError(f"{where}: the default first_draft is 'block' or 'priced', got {first!r}")
    try:
        tree = tree_setting(record.get("tree") or "chain")
    except SBDError as e:
        raise SBDError(f"{where}: {e}") from None
    return VerifySettings(draft=draft, lookup=lookup, lookup_max=lookup_max, tree=tree,
                          price_first_draft=first == "priced")


def model_defaults(model) -> VerifySettings:
    """The measured configuration `model` records: its drafting adapter's, else its config's, else
    `GENERAL`, or `UNTRAINED` when its masks were never trained for drafting (no adapter and no record
    of SBD training, `sbd.decoding.trained_for`): whole blocks that give way to plain steps while they
    are refused, so an untrained model never runs slower than plain decoding for long."""
    from ..models.facts import decoding_record
    from .trained_for import trained_for

    recorded = decoding_record(model)
    if recorded is not None:
        return from_record(*recorded)
    trained = trained_for(model)
    return GENERAL if trained is not None and "sbd-verify" in trained else UNTRAINED
