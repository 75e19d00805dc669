"""`DecodeSpec`: how to decode, decided in one place.

Every entry point (`generate`, `sbd generate`, the server, lm-eval, the vLLM launcher) turns what its
user gave into a spec with `DecodeSpec.resolve(model, **given)` (or `build(facts, defaults, **given)`
where the model's facts are already read), and rows read the spec. Resolving fills each setting left
out (None) with the default the model records (`sbd.decoding.defaults`, `sbd.models.facts`) and refuses
every combination that would decode something other than asked with one line naming the field
(`SpecError.field`). One rule (`reads`, `_unread`) refuses every setting given that the chosen decoding
does not read (`block_size` or `draft` with method ntp, ...); settings left to the defaults never trigger
it, and a sampling setting (`top_p`, `seed`) is taken with greedy decoding, as OpenAI takes it.

A refusal is written once and spelled the way each interface writes its settings
(`SpecError.spelled`): `lookup=True` for Python, `--lookup` for the command line, `"lookup": true` over
HTTP.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field, fields, replace

from ..errors import SBDError
from ..models.facts import ModelFacts
from ..sampler import PROXIES
from .defaults import PLAIN, VerifySettings, model_defaults, tree_setting
from .draft_policy import DraftOptions
from .llama_forward import runs_natively
from .processing import Processing
from .trained_for import SPELLINGS, check_decoding

METHODS = ("ntp", "sbd", "sbd-verify")
DRAFTS = ("block", "eb", "adaptive")  # how sbd-verify drafts: whole blocks, the EB rule, or a length per row
GAMMA = 0.35  # the EB rule's bound when a call leaves gamma out
PROXY = "entropy"
PROCESSING = ("logit_bias", "presence_penalty", "frequency_penalty", "top_p", "logprobs")
# a field as the server's requests name it, where that differs
HTTP_NAMES = {"max_new_tokens": "max_tokens"}


def _name(name: str, interface: str) -> str:
    if interface == "cli" or (interface == "serve" and name != "anchor"):
        return f"--{name.replace('_', '-')}"
    return HTTP_NAMES.get(name, name) if interface in ("http", "serve") else name


def spell(template: str, interface: str = "python") -> str:
    """A refusal's template in one interface's words: `{lookup}` names a field, `{lookup=True}` names
    it with a value (a Python literal, or a bare word for a string)."""
    def one(m: re.Match) -> str:
        name, eq, value = m.group(1).partition("=")
        if not eq:
            return _name(name, interface)
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            value = float(value) if value in ("inf", "nan") else value  # else a bare word such as sbd-verify
        if interface == "cli" and value is False:
            return f"--no-{name.replace('_', '-')}"
        return SPELLINGS[interface](HTTP_NAMES.get(name, name) if interface == "http" else name, value)

    return re.sub(r"\{([a-z_]+(?:=[^{}]*)?)\}", one, template)


class SpecError(SBDError):
    """A refused decoding setting: `field` names it; `str()` is the Python spelling, `spelled(interface)`
    the command line's ("cli", "serve") or HTTP's ("http")."""

    def __init__(self, field: str, template: str):
        self.field, self.template = field, template
        super().__init__(spell(template))

    def spelled(self, interface: str) -> str:
        return spell(self.template, interface)

    @property
    def param(self) -> str:
        """The request field an HTTP error names."""
        return HTTP_NAMES.get(self.field, self.field)


def _int(value, lowest: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lowest


@dataclass(frozen=True)
class DecodeSpec:
    """How rows decode: a method and every setting it reads, defaults filled and combinations checked.

    method: "sbd-verify" (lossless drafts), "ntp" or "sbd" (the paper's, lossy). block_size: tokens per
    block. gamma, proxy: the EB rule (method sbd; sbd-verify with draft "eb"). draft, lookup,
    lookup_max, tree: how sbd-verify drafts (`sbd.decoding.defaults.VerifySettings`); fallback: plain
    steps while untrained masks' drafts fail. anchor (sbd): anchored on the next-token head.
    reveal_per_forward (sbd): a fixed reveal schedule for timing. static_shapes, compile: fixed forward
    widths, compiled. processing: OpenAI's logit processors and logprobs (ntp, sbd-verify).
    draft_options: sbd-verify's drafting switches for experiments (`sbd.decoding.draft_policy.DraftOptions`)."""

    method: str = "sbd-verify"
    block_size: int = 16
    max_new_tokens: int = 256
    temperature: float = 0.0
    gamma: float = GAMMA
    proxy: str = PROXY
    draft: str = "block"
    lookup: bool = False
    lookup_max: int = PLAIN.lookup_max
    tree: tuple[int, ...] | None = None
    fallback: bool = False
    anchor: bool = False
    reveal_per_forward: int | None = None
    static_shapes: bool = False
    compile: bool = False
    stop: tuple[str, ...] = ()
    processing: Processing = field(default_factory=Processing)
    draft_options: DraftOptions = field(default_factory=DraftOptions)

    @property
    def fixed_shapes(self) -> bool:
        return self.static_shapes or self.compile

    @property
    def settings(self) -> VerifySettings | None:
        """sbd-verify's drafting settings (None for the other methods)."""
        if self.method != "sbd-verify":
            return None
        return VerifySettings(self.draft, self.lookup, self.lookup_max, self.tree, self.fallback,
                              self.draft_options.price_first_draft)

    @property
    def eb_gamma(self) -> float | None:
        """sbd-verify: the EB rule's bound its drafts are revealed by (draft "eb"), else None."""
        return float(self.gamma) if self.draft == "eb" else None

    def reads(self) -> dict:
        """The settings this spec's decoding reads, for summaries: the method, and of block_size, gamma,
        proxy and anchor those the one table (`reads`) says it reads; sbd-verify's drafting is `settings`."""
        known = reads(self.method, self.temperature, self.draft, self.lookup, self.reveal_per_forward)
        return {"method": self.method, **{k: getattr(self, k) for k in ("block_size", "gamma", "proxy", "anchor")
                                          if k in known}}

    @classmethod
    def resolve(cls, model, *, defaults: VerifySettings | None = None, interface: str = "python",
                **given) -> "DecodeSpec":
        """The spec for `model` from the settings given (None: left out). defaults: greedy sbd-verify's
        drafting settings for those left out (default: what the model records). Also refuses a method
        the model's drafter was not trained for (`sbd.decoding.trained_for`, in `interface`'s words)."""
        spec = cls.build(ModelFacts.of(model), defaults=model_defaults(model) if defaults is None else defaults,
                         **given)
        check_decoding(model, spec.method, anchor=spec.anchor, interface=interface)
        if spec.compile and runs_natively(model):  # a slow path must not be a silent one
            raise SpecError("compile", "{compile=True} runs slower than sbd's eager forward of this model on a CPU, "
                                       "whose decoder layers run from C++ (SmolLM2-135M: 0.75-0.84x eager, and up to "
                                       "minutes to compile); leave it out (SBD_NATIVE=0 switches the C++ layers off)")
        return spec

    @classmethod
    def check(cls, **given) -> None:
        """The checks that need no model: each setting given (not None) is valid and read by the decoding
        chosen (the command line runs them before it loads a model). SpecError names the first that is not.
        What hangs on the model's defaults (gamma or proxy under sbd-verify without a draft given, lookup_max
        without lookup given) is left to `resolve`, whose refusal names what the defaults chose."""
        _check_given({k: v for k, v in given.items() if v is not None})

    @classmethod
    def build(cls, facts: ModelFacts, *, defaults: VerifySettings = PLAIN, **given) -> "DecodeSpec":
        """`resolve` on facts already read: the settings given, checked, and the defaults for the rest
        (defaults: greedy sbd-verify's drafting settings; the plain ones unless given)."""
        g = {k: v for k, v in given.items() if v is not None}
        _check_given(g)
        method, temperature = g.get("method", "sbd-verify"), g.get("temperature", 0.0)
        verify, draft = method == "sbd-verify", g.get("draft")
        # drafting settings: given, else the defaults where they are exact and fit (greedy sbd-verify)
        base = defaults if verify and not temperature > 0 else PLAIN
        chosen_draft = draft if draft is not None else base.draft
        if chosen_draft == "eb":  # EB-revealed drafts take neither lookup nor trees
            base = replace(base, lookup=False, tree=None)
        if g.get("static_shapes") or g.get("compile"):
            base = replace(base, tree=None)
        lookup = g.get("lookup", base.lookup)
        _unread(g, draft=chosen_draft, lookup=lookup)  # now with what the defaults resolved to
        tree = tree_setting(g.get("tree"))
        if facts.weights and (g.get("static_shapes") or g.get("compile") or tree not in (None, "default")):
            name = "compile" if g.get("compile") else "static_shapes" if g.get("static_shapes") else "tree"
            raise SpecError(name, f"{{{name}}} is not supported on {facts.weights} weights yet: their exact "
                                  "attention (each committed token as NTP computes it) runs eagerly over chains; "
                                  "sbd.load(..., weights=\"float\") (--weights float) keeps the layers float")
        if facts.weights and tree == "default":
            base = replace(base, tree=None)
        block = g.get("block_size", facts.block_size)
        if method != "ntp" and facts.context and block > facts.context:
            raise SpecError("block_size", f"{{block_size={block}}} exceeds the model's {facts.context} positions")
        if facts.mask_id is not None and not (isinstance(facts.mask_id, int) and 0 <= facts.mask_id < facts.vocab):
            raise SBDError(f"the model's SBD mask token id {facts.mask_id!r} lies outside its {facts.vocab} "
                           "embeddings (config.sbd_mask_token_id); add the token with sbd.add_mask_token(model, "
                           "tokenizer)")
        if method != "ntp" and facts.mask_id is None:
            raise SpecError("method", "this model has no SBD mask token (config.sbd_mask_token_id); add one with "
                                      "sbd.add_mask_token(model, tokenizer) and fine-tune it with `sbd train`, or "
                                      "use {method=ntp}")
        processing = _processing(g)
        try:
            processing.validate(facts.vocab)
        except SBDError as e:
            raise SpecError("logit_bias", str(e)) from None
        return cls(method=method, block_size=block, max_new_tokens=g.get("max_new_tokens", 256),
                   temperature=temperature, gamma=g.get("gamma", GAMMA), proxy=g.get("proxy", PROXY),
                   draft=chosen_draft, lookup=lookup, lookup_max=g.get("lookup_max", base.lookup_max),
                   tree=base.tree if tree == "default" else tree,
                   fallback=verify and base.fallback and draft is None, anchor=g.get("anchor", False),
                   reveal_per_forward=g.get("reveal_per_forward"), static_shapes=bool(g.get("static_shapes")),
                   compile=bool(g.get("compile")), stop=tuple(g.get("stop", ())), processing=processing,
                   draft_options=g.get("draft_options") or DraftOptions(
                       price_first_draft=base.price_first_draft and chosen_draft == "adaptive"))


FITS = "{method=sbd-verify} with greedy decoding ({temperature=0}) and {draft=block} or {draft=adaptive}"
EB = "{method=sbd} and by {method=sbd-verify} with {draft=eb}"
HEAD = "the next-token head, read by {method=ntp} and {method=sbd-verify}"
# Which settings each decoding reads (`reads`); one given (not None) that the chosen decoding does not read is
# refused in one line that names it (`_unread`): what reads it (below), then what this call decodes with.
# Every decoding reads method, max_new_tokens, temperature, stop, static_shapes and compile.
WHO_READS = {
    "block_size": "sets the blocks of {method=sbd} and {method=sbd-verify}",
    "gamma": "sets the EB rule, read by " + EB,
    "proxy": "sets the EB rule, read by " + EB,
    "anchor": "applies to {method=sbd} (plain SBD anchored on the next-token head)",
    "reveal_per_forward": "applies to {method=sbd} only (a fixed reveal schedule)",
    "draft": "applies to {method=sbd-verify} (how it drafts)",
    "draft_options": "holds drafting switches, read by {method=sbd-verify}",
    "lookup": "applies to " + FITS,
    "tree": "applies to " + FITS,
    "lookup_max": "sets the longest prompt-lookup draft, read by greedy {method=sbd-verify} with {lookup=True}",
    "processing": "acts on " + HEAD,
    **{name: "acts on " + HEAD for name in PROCESSING},
}
ALWAYS = frozenset({"method", "max_new_tokens", "temperature", "stop", "static_shapes", "compile"})
HEAD_SETTINGS = frozenset({"processing", *PROCESSING})
# what each method reads at most; `reads` takes away what the other settings switch off
READS = {
    "ntp": ALWAYS | HEAD_SETTINGS,
    "sbd": ALWAYS | {"block_size", "gamma", "proxy", "anchor", "reveal_per_forward"},
    "sbd-verify": ALWAYS | HEAD_SETTINGS | {"block_size", "draft", "draft_options", "gamma", "proxy", "lookup",
                                            "lookup_max", "tree"},
}


def reads(method: str, temperature: float, draft: str | None, lookup: bool,
          reveal_per_forward: int | None) -> frozenset:
    """The settings a decoding reads: `method` at `temperature`; sbd-verify drafting with `draft` (and
    `lookup`); sbd with `reveal_per_forward`. A sampling setting of a method that samples by it (top_p, and
    seed, which `generate` takes beside the spec) counts as read with greedy decoding too, where it changes
    nothing: OpenAI takes them at temperature 0, and its clients send them with every request."""
    out = set(READS[method])
    if method == "sbd" and reveal_per_forward is not None:
        out -= {"gamma", "proxy"}  # a fixed schedule instead of the EB rule
    if method == "sbd-verify":
        if draft != "eb":
            out -= {"gamma", "proxy"}  # only EB-revealed drafts follow the EB rule
        if draft == "eb" or temperature > 0:
            out -= {"lookup", "lookup_max", "tree"}  # exact with greedy chains of block or adaptive drafts only
        elif not lookup:
            out.discard("lookup_max")
    return frozenset(out)


def _spelled(name: str, value) -> str:
    """A setting as its user wrote it, in a refusal's template: with its value where that is one word (a tree's
    widths are a list in Python and HTTP, a string on the command line: named alone)."""
    simple = isinstance(value, (bool, int, float)) or (isinstance(value, str) and value.replace("-", "").isalnum())
    return f"{{{name}={value!r}}}" if simple and name not in ("lookup_max", "tree") else f"{{{name}}}"


def _unread(g: dict, draft: str | None, lookup: bool | None) -> None:
    """The one rule: a setting given (in `g`) that the chosen decoding does not read is a SpecError naming it.
    draft, lookup: sbd-verify's as resolved (the model's defaults for those not given); None where no model
    is at hand (`DecodeSpec.check`): the settings whose fate hangs on them wait for `build`."""
    method, temperature = g.get("method", "sbd-verify"), g.get("temperature", 0.0)
    greedy, reveal = not temperature > 0, g.get("reveal_per_forward")
    if method == "sbd-verify" and not greedy and draft is None:
        draft = "block"  # sampling drafts whole blocks whatever a model records
    known = reads(method, temperature, draft, bool(lookup), reveal)
    for name in g:
        if name in known:
            continue
        if method == "sbd-verify" and (draft is None and name in ("gamma", "proxy") or
                                       lookup is None and name == "lookup_max" and "lookup" in known):
            continue  # read or not by what the model's defaults resolve to: `build` decides, and says so
        value = g[name]
        if name == "processing":  # a whole Processing: named by its first setting that is not the default
            name = next((k for k in PROCESSING if getattr(value, k) != getattr(Processing(), k)), name)
            value = getattr(value, name, value)
        if name == "lookup_max" and "lookup" in known:  # greedy sbd-verify, lookup off
            off = "{lookup=False}" if "lookup" in g else "this model's default; {lookup=True} turns it on"
            raise SpecError(name, f"{{lookup_max}} sets the longest prompt-lookup draft, but lookup is off here ({off})")
        raise SpecError(name, f"{_spelled(name, value)} {WHO_READS[name]}; here {_here(g, draft)}")


def _here(g: dict, draft: str | None) -> str:
    """What this call decodes with, in a refusal's words (a draft the model's defaults chose says so)."""
    method, temperature = g.get("method", "sbd-verify"), g.get("temperature", 0.0)
    if method == "ntp":
        return "{method=ntp} decodes one token per forward with the next-token head"
    if method == "sbd":
        reveal = g.get("reveal_per_forward")
        return "{method=sbd} " + (f"reveals a fixed {{reveal_per_forward={reveal}}} per forward" if reveal is not None
                                  else "reveals its blocks by the EB rule")
    if draft is None:  # no model at hand to say which
        return "{method=sbd-verify} checks its drafts with the next-token head"
    default = " (this model's default)" if "draft" not in g and not temperature > 0 else ""
    sampling = f" and samples ({{temperature={temperature!r}}})" if temperature > 0 else ""
    return f"{{method=sbd-verify}} drafts with {{draft={draft!r}}}{default}{sampling}"


def _processing(g: dict) -> Processing:
    """The processors given one by one (or as one `processing`), checked."""
    if "processing" in g:
        return g["processing"]
    try:
        return Processing(**{k: g[k] for k in PROCESSING if k in g})
    except SBDError as e:
        name = next((k for k in PROCESSING if str(e).startswith(k)), "logit_bias")
        raise SpecError(name, str(e)) from None


def _check_given(g: dict) -> None:
    """`DecodeSpec.check` on the settings given (None dropped): each valid, and read by the decoding chosen
    (`_unread`, as far as it can tell without the model's defaults)."""
    unknown = sorted(set(g) - OPTIONS)
    if unknown:
        raise SBDError(f"unknown decoding option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                       f"choose from {', '.join(sorted(OPTIONS))}")
    method = g.get("method", "sbd-verify")
    if method not in METHODS:
        raise SpecError("method", f"unknown {{method={method}}}; choose one of {', '.join(METHODS)}")
    temperature = g.get("temperature", 0.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
            not math.isfinite(temperature) or temperature < 0:
        raise SpecError("temperature", f"{{temperature}} must be a finite number >= 0, got {temperature!r}")
    greedy = not temperature > 0
    draft = g.get("draft")
    if draft is not None and draft not in DRAFTS:
        raise SpecError("draft", f"unknown {{draft={draft}}}; choose one of {', '.join(DRAFTS)}")
    try:
        tree = tree_setting(g.get("tree"))
    except SBDError as e:
        raise SpecError("tree", str(e)) from None
    lookup = g.get("lookup")
    if lookup is not None and not isinstance(lookup, bool):
        raise SpecError("lookup", f"{{lookup}} is true or false, got {lookup!r}")
    lookup_max = g.get("lookup_max")
    if lookup_max is not None and not _int(lookup_max):
        raise SpecError("lookup_max", f"{{lookup_max}} must be an integer >= 1, got {lookup_max!r}")
    reveal = g.get("reveal_per_forward")
    if reveal is not None and not _int(reveal):
        raise SpecError("reveal_per_forward", "{reveal_per_forward} must be an integer >= 1")
    gamma = g.get("gamma", GAMMA)
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or math.isnan(gamma) or gamma < 0:
        raise SpecError("gamma", f"{{gamma}} must be a number >= 0 (inf allowed), got {gamma!r}")
    proxy = g.get("proxy", PROXY)
    if proxy not in PROXIES:
        raise SpecError("proxy", f"unknown {{proxy={proxy}}}; choose one of {', '.join(PROXIES)}")
    anchor = g.get("anchor", False)
    if not isinstance(anchor, bool):
        raise SpecError("anchor", f"{{anchor}} is true or false, got {anchor!r}")
    block = g.get("block_size")
    if block is not None and not _int(block):
        raise SpecError("block_size", f"{{block_size}} must be an integer >= 1, got {block!r}")
    if not _int(g.get("max_new_tokens", 256)):
        raise SpecError("max_new_tokens", f"{{max_new_tokens}} must be an integer >= 1, got {g['max_new_tokens']!r}")
    stop = g.get("stop", ())
    if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
        raise SpecError("stop", "{stop} must be a list of non-empty strings")
    options = g.get("draft_options")
    if options is not None and not isinstance(options, DraftOptions):
        raise SpecError("draft_options", f"{{draft_options}} is a sbd.decoding.draft_policy.DraftOptions, got "
                                         f"{type(options).__name__}")
    processing = g.get("processing")
    if processing is not None and not isinstance(processing, Processing):
        raise SpecError("processing", f"{{processing}} is a sbd.decoding.processing.Processing, got "
                                      f"{type(processing).__name__}")
    _processing(g)
    _unread(g, draft=draft, lookup=lookup)  # settings nothing would read: said, never ignored
    # combinations of settings that are each read
    if draft in ("adaptive", "eb") and not greedy:
        why = ("its draft lengths follow measured timings, so with sampling a seed would no longer reproduce the "
               "sample" if draft == "adaptive" else "the acceptance rule of sampling needs every draft token drawn "
               "from its own distribution, which out-of-order reveals break")
        raise SpecError("draft", f"{{draft={draft}}} is greedy only: {why}; use {{draft=block}}")
    if tree not in ("default", None) and (g.get("static_shapes") or g.get("compile")):
        raise SpecError("tree", "tree drafts have no fixed widths: {static_shapes=True} and {compile=True} refuse "
                                "{tree}")
    if anchor and (proxy != "entropy" or reveal is not None):
        raise SpecError("proxy" if proxy != "entropy" else "reveal_per_forward",
                        "{anchor=True} reveals left to right under the entropy bound: {proxy} and "
                        "{reveal_per_forward} do not apply")


# what `resolve` and `build` take: the spec's fields, and the processors one by one
OPTIONS = frozenset({f.name for f in fields(DecodeSpec)} - {"fallback"}) | set(PROCESSING)
