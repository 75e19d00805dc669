"""One drafter interface (`sbd.decoding.proposers.base.Drafter`): every drafter sbd ships implements it in its
own file, and the sampler head's chain is a drafter of its own (`HeadChain`), not a mode of the masks'.

- each drafter module holds a class with `source`, `width`, `values(seen)` and `propose(values, seen)`;
- `HeadChain` gives exactly the walk of the head's table (with and without the probabilities a cut reads),
  and differs from the masks' argmax where a random head re-ranks; `MaskChain` never reads a head;
- both lay their values out so that a caller can read them among other values (`width`).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch
from conftest import _model
from test_sampler_head import attach_random_head, random_positions

from sbd.decoding import proposers
from sbd.decoding.proposers.base import Drafter, Seen
from sbd.decoding.proposers.chain import MaskChain
from sbd.decoding.proposers.head import Drafting, HeadChain, draft_table, walk
from sbd.drafters import sampler_head as heads


def drafter_classes():
    """(module name, class) for every class in sbd.decoding.proposers that proposes drafts (the protocol aside)."""
    found = []
    for info in pkgutil.iter_modules(proposers.__path__):
        module = importlib.import_module(f"{proposers.__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and hasattr(cls, "propose") and cls is not Drafter:
                found.append((info.name, cls))
    return found


def test_every_drafter_implements_the_one_interface_in_its_own_file():
    classes = drafter_classes()
    assert {name for name, _ in classes} == {"chain", "head", "lookup", "tree", "eb"}
    assert sum(1 for name, _ in classes if name == "head") == 1  # the head's chain is its own drafter
    want = [list(inspect.signature(getattr(Drafter, call)).parameters) for call in ("values", "propose")]
    for name, cls in classes:
        assert cls.source in ("masks", "lookup"), (name, cls)
        assert [list(inspect.signature(getattr(cls, call)).parameters)[:len(w)]
                for call, w in zip(("values", "propose"), want)] == want, (name, cls)
        drafter = cls() if cls in (MaskChain, HeadChain) else None
        assert drafter is None or isinstance(drafter.width, int)


@pytest.fixture
def headed():
    """The shared tiny Llama with a random sampler head (taken off again afterwards)."""
    model = _model("llama")
    head = attach_random_head(model, seed=3, scale=3.0, top_k=4)
    yield model, head
    heads.detach(model)


@pytest.mark.parametrize("cut", [False, True])
def test_the_heads_chain_is_the_walk_of_its_table_and_the_masks_chain_their_argmax(headed, cut):
    model, head = headed
    rescored = 0
    for hidden, logits in random_positions(model, 5, draws=8):
        first = torch.tensor(7, device=model.device)
        seen = Seen(logits, 0, first, Drafting(head, model, hidden))
        chains = MaskChain(), HeadChain()
        values = []
        with torch.no_grad():
            for chain in chains:
                chain.cut = cut
                values += torch.cat(chain.values(seen)).tolist() + [-1.0]  # another value between them
            table = draft_table(head, model, hidden, logits, first, probs=cut).tolist()
        masks, mine = chains[0].propose(values), chains[1].propose(values[chains[0].width + 1:])
        assert masks == logits.argmax(-1).tolist()
        want = walk(table, 5, probs=cut)
        assert (mine, chains[1].probs) == (want if cut else (want, None))
        assert (chains[0].probs is not None) == cut and chains[1].width == len(table)
        rescored += mine != masks
    assert rescored  # the random head re-ranked something: the two drafters are not the same


def test_no_masks_no_chain(headed):
    model, head = headed
    hidden, logits = next(random_positions(model, 0, draws=1))
    seen = Seen(logits, 0, torch.tensor(7, device=model.device), Drafting(head, model, hidden))
    for chain in (MaskChain(), HeadChain()):
        chain.cut = True
        values = chain.values(seen)
        assert chain.width == sum(v.numel() for v in values) == 0 and chain.propose([]) == []
