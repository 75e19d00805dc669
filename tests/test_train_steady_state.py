"""A training step at the hardware's speed (issue 54, item 3), each change exact for what it claims:

- bucketed lengths (CUDA's flex_attention path): a batch padded to `flex.bucket_length` has the loss and
  gradients of the unpadded batch, its BlockMask is the dense mask's attention on the real positions,
  and a compiled flex_attention meets one kernel per bucket, never one per block size or batch length;
- no host read per step (`SBDTrainer.sync_free`, on by default on CUDA): the forward, loss and backward
  of a step read no device value (counted on CPU by wrapping every Python-level read, as
  tests/test_host_sync.py does for decoding), with the loss and gradients of the default step.
"""

from __future__ import annotations

import random

import pytest
import torch

import sbd
from sbd.models import tiny
from sbd.training import attention
from sbd.training.collator import SBDDataCollator
from sbd.training.data import tokenize_records
from sbd.training.flex import bucket_length, training_block_mask
from sbd.training.loss import sbd_loss
from sbd.training.trainer import SBDTrainer, sbd_training_args

MASK_ID = 2
TEXTS = [" ".join(str(i) for i in range(s, s + 5 + (7 * s) % 17)) for s in range(32)]


def _model(seed=1):
    cfg = tiny.tiny_config("llama", vocab_size=97, hidden=32, layers=2, heads=4, kv_heads=2, context=256)
    model = tiny.random_model(cfg, seed=seed)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(5)
    return model.train()


def _clean(collator, lengths=(19, 11, 16), prompts=(5, 3, 0), seed=3):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, 97, (n - 1,), generator=g).tolist() + [0] for n in lengths]  # each ends with EOS
    return collator.pad([{"input_ids": s, "prompt_length": p} for s, p in zip(seqs, prompts)]), g


def _loss_and_grads(model, batch, num_clean):
    batch = dict(batch)
    labels = batch.pop("labels")
    batch.pop("num_clean")
    model.zero_grad(set_to_none=True)
    parts = sbd_loss(attention.training_logits(model, batch, labels, num_clean), labels, num_clean)
    parts.loss.backward()
    return parts, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_bucket_lengths():
    sizes = [bucket_length(t) for t in range(1, 3000)]
    assert all(s >= t for t, s in zip(range(1, 3000), sizes))
    assert sizes == sorted(sizes)
    assert set(sizes[:128]) == {16, 32, 64, 128}
    assert all(s % 128 == 0 and s - t < 128 for t, s in zip(range(129, 3000), sizes[128:]))
    assert len(set(sizes[: 2 * 1024 + 16])) <= 4 + (2 * 1024 + 16) // 128 + 1


def _labelled_logits(model, batch, num_clean):
    batch = dict(batch)
    labels = batch.pop("labels")
    batch.pop("num_clean")
    with torch.no_grad():
        return attention.training_logits(model, batch, labels, num_clean), labels[labels != -100]


@pytest.mark.parametrize("aligned", [False, True], ids=["paper", "aligned"])
@pytest.mark.parametrize("k", [3, 16])
@pytest.mark.parametrize("drop,bucket", [(False, True), (True, False), (True, True)],
                         ids=["bucketed", "unlabelled-dropped", "both"])
def test_a_shorter_or_bucketed_batch_has_the_loss_and_gradients_of_the_full_one(aligned, k, drop, bucket):
    """The same draws, fewer noisy blocks (those without a label left out) and/or the length padded to a
    bucket: the same labels in the same order, the same logits at every label, loss and gradients."""
    model = _model()
    c = SBDDataCollator(mask_token_id=MASK_ID, eos_token_id=0, align_to_completion=aligned)
    clean, g = _clean(c)
    n, m = clean["input_ids"].shape[1], c.noisy_length(clean, k)
    eta, u = c.draw_noise(3, m, g)
    eta[0] = 0.15  # a row with blocks that hold no mask
    full = c.corrupt(clean, k, eta, u)
    other = c.corrupt(clean, k, eta, u, drop_unlabelled=drop, length_to=bucket_length if bucket else None)
    t = other["input_ids"].shape[1]
    if bucket:
        assert t == bucket_length(t) and (t > n + m or drop)
    if drop:  # the test leaves something out
        real = [c.corrupt(clean, k, eta, u, dense_mask=False, drop_unlabelled=d)["noisy_layout"][1].sum() for d in
                (False, True)]
        assert real[1] < real[0] and t <= (bucket_length(n + m) if bucket else n + m)
    if not drop:  # padding only: the real part is the same batch, the padding has no label
        assert torch.equal(other["input_ids"][:, : n + m], full["input_ids"])
        assert torch.equal(other["labels"][:, : n + m], full["labels"]) and (other["labels"][:, n + m:] == -100).all()
        assert torch.equal(other["attention_mask"][..., : n + m, : n + m], full["attention_mask"])
    ref_logits, ref_targets = _labelled_logits(model, full, n)
    logits, targets = _labelled_logits(model, other, n)
    assert torch.equal(targets, ref_targets)
    assert (logits - ref_logits).abs().max() <= 1e-4
    ref, ref_grads = _loss_and_grads(model, full, n)
    got, grads = _loss_and_grads(model, other, n)
    assert abs(got.loss.item() - ref.loss.item()) <= 1e-5 * max(1.0, abs(ref.loss.item()))
    assert torch.equal(got.ntp_count, ref.ntp_count) and torch.equal(got.matp_count, ref.matp_count)
    for name, g_ref in ref_grads.items():
        assert torch.allclose(grads[name], g_ref, atol=1e-6, rtol=1e-4), name


def test_a_batch_without_any_masked_label_keeps_no_noisy_block():
    c = SBDDataCollator(mask_token_id=MASK_ID, eos_token_id=0)
    clean, _ = _clean(c)
    n, m = clean["input_ids"].shape[1], c.noisy_length(clean, 4)
    batch = c.corrupt(clean, 4, torch.zeros(3), torch.rand(3, m), drop_unlabelled=True)  # eta = 0: no mask
    assert batch["input_ids"].shape[1] == n and batch["attention_mask"].shape[-1] == n


def test_a_bucketed_ntp_batch_has_the_same_loss():
    model = _model()
    c = SBDDataCollator(mask_token_id=MASK_ID, eos_token_id=0)
    clean, _ = _clean(c)
    n = clean["input_ids"].shape[1]
    plain, padded = c.causal(clean), c.causal(clean, width=bucket_length(n))
    assert padded["input_ids"].shape[1] == 32 > n
    for batch in (plain, padded):
        batch["num_clean"] = batch["input_ids"].shape[1]
    ref, _ = _loss_and_grads(model, plain, None)
    got, _ = _loss_and_grads(model, padded, None)
    assert abs(got.loss.item() - ref.loss.item()) <= 1e-5 * max(1.0, abs(ref.loss.item()))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("aligned,k,drop", [(False, 4, False), (True, 3, False), (False, 4, True), (True, 5, True)])
def test_the_bucketed_block_mask_is_the_dense_mask(aligned, k, drop, monkeypatch):
    """What the trainer builds on CUDA (BlockMask, bucketed, with or without the unlabelled blocks) is the
    dense mask of the same batch, position by position, and flex_attention under it (its forward runs on
    CPU) is SDPA's under the dense mask."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from sbd.training import flex as sbd_flex

    c = SBDDataCollator(mask_token_id=MASK_ID, eos_token_id=0, block_size=k, align_to_completion=aligned)
    clean, g = _clean(c, lengths=(37, 21, 30), prompts=(5, 3, 9))
    m = c.noisy_length(clean, k)
    eta, u = torch.tensor([0.5, 0.2, 0.7]), torch.rand(3, m, generator=g)
    kw = dict(drop_unlabelled=drop, length_to=bucket_length)
    dense = c.corrupt(clean, k, eta, u, **kw)
    sparse = c.corrupt(clean, k, eta, u, dense_mask=False, **kw)
    assert torch.equal(dense["input_ids"], sparse["input_ids"]) and torch.equal(dense["labels"], sparse["labels"])
    n, t = dense["num_clean"], dense["input_ids"].shape[1]
    block = training_block_mask(clean["lengths"], c._origins(clean), c.noisy_lengths(clean, k), n, t - n, k, "cpu",
                                layout=sparse["noisy_layout"])
    captured = {}

    def as_dense(mask_mod, B, H, Q_LEN, KV_LEN, device):
        captured["mask"] = flex.create_mask(mask_mod, B, 1, Q_LEN, KV_LEN, device=device)
        return captured["mask"]

    monkeypatch.setattr(flex, "create_block_mask", as_dense)
    sbd_flex.training_block_mask(clean["lengths"], c._origins(clean), c.noisy_lengths(clean, k), n, t - n, k, "cpu",
                                 layout=sparse["noisy_layout"])
    assert torch.equal(captured["mask"], dense["attention_mask"])
    q, key, v = (torch.randn(3, 2, t, 16, generator=g) for _ in range(3))
    out = flex.flex_attention(q, key, v, block_mask=block)
    ref = torch.nn.functional.scaled_dot_product_attention(q, key, v, attn_mask=dense["attention_mask"])
    assert (out - ref).abs().max() <= 1e-5


def _trainer(tmp_path, mode="sbd", steps=4, **kw):
    path = tmp_path / "model"
    if not path.exists():
        tiny.create(path, texts=TEXTS, vocab_size=200, hidden=32, layers=2, heads=4, kv_heads=2, context=128)
    model, tok = sbd.load(path, probe=False)
    data = tokenize_records([{"text": t} for t in TEXTS], tok, 64, tok.mask_token_id)
    args = sbd_training_args(tmp_path / f"out_{mode}", steps=steps, batch_size=4, lr=3e-3, warmup_steps=1,
                             save_steps=1000, logging_steps=1000, seed=5, **kw)
    return SBDTrainer(model, args, data_collator=SBDDataCollator(tok), train_dataset=data, processing_class=tok,
                      mode=mode, show_progress=False), tok, data


@pytest.fixture
def flex_compiles(monkeypatch):
    """transformers' compiled flex_attention replaced by one compiled the strict way (dynamic=False: every
    shape and every number the mask_mod reads is guarded) with a backend that runs on CPU and counts the
    compiles; the list of compiles is returned."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    import transformers.integrations.flex_attention as hf_flex
    from torch.nn.attention.flex_attention import flex_attention

    compiles = []

    def count(gm, example_inputs):
        compiles.append(1)
        return gm.forward

    torch._dynamo.reset()
    wrapper = hf_flex.WrappedFlexAttention(True)  # the singleton, for modules in training mode
    monkeypatch.setattr(wrapper, "_compiled_flex_attention", torch.compile(flex_attention, backend=count, dynamic=False))
    yield compiles
    torch._dynamo.reset()


def _flex_trainer(tmp_path, monkeypatch, mode="sbd"):
    """A trainer that builds CUDA's batches (flex BlockMask, bucketed) on CPU, its model on flex_attention."""
    trainer, tok, data = _trainer(tmp_path, mode=mode)
    trainer.model.train()  # transformers compiles flex_attention anew when the training flag changes
    trainer.model.set_attn_implementation("flex_attention")
    monkeypatch.setattr(trainer, "_use_flex", lambda: True)
    return trainer, data


def test_flex_attention_compiles_once_per_bucket_not_per_step(tmp_path, monkeypatch, flex_compiles):
    """Over steps whose block size and batch length both change, one compile per bucket; without the
    buckets, and with k and L as Python numbers in the mask_mod, nearly one per step."""
    trainer, data = _flex_trainer(tmp_path, monkeypatch)
    rng = random.Random(0)
    shapes, raw = set(), set()
    for step in range(12):
        clean = trainer.sbd_collator.pad([data[i] for i in rng.sample(range(len(data)), 4)])
        batch = trainer.build_batch(clean, step)
        k = trainer.block_size_for_step(step)
        raw.add((clean["input_ids"].shape[1] + trainer.sbd_collator.noisy_length(clean, k), k))
        shapes.add(batch["input_ids"].shape[1])
        inputs = {key: batch[key] for key in ("input_ids", "position_ids", "attention_mask")}
        with torch.no_grad():  # flex_attention has no backward on CPU; the forward's guards are the same
            trainer.model(**inputs, use_cache=False)
    assert len(raw) >= 8  # the unbucketed (length, k) changed nearly every step
    assert all(bucket_length(t) == t for t in shapes) and len(shapes) <= 2
    assert len(flex_compiles) == len(shapes)


# -- host reads --------------------------------------------------------------------------------------
READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero", "masked_select")


@pytest.fixture
def count_reads(monkeypatch):
    """Counts every Python-level read of a tensor value, and boolean indexing (the device counts first)."""
    counter = {"n": 0, "on": False, "where": []}

    def note(what):
        if counter["on"]:
            counter["n"] += 1
            counter["where"].append(what)

    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapped(self, *a, _original=original, _name=name, **k):
            note(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    for name in ("nonzero", "masked_select", "argwhere"):
        original = getattr(torch, name)

        def wrapped_fn(*a, _original=original, _name=name, **k):
            note("torch." + _name)
            return _original(*a, **k)

        monkeypatch.setattr(torch, name, wrapped_fn)

    class BooleanIndex(torch.overrides.TorchFunctionMode):
        """Indexing by a boolean tensor (seen through a mode: assigning Tensor.__getitem__ would leave tensors
        looking like sequences to torch.tensor for the rest of the session)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.__getitem__:
                parts = args[1] if isinstance(args[1], tuple) else (args[1],)
                if any(torch.is_tensor(p) and p.dtype == torch.bool for p in parts):
                    note("boolean index")
            return func(*args, **(kwargs or {}))

    with BooleanIndex():
        yield counter


def _step_reads(trainer, batch, count_reads):
    """Host reads of one training step's device part: forward, loss and backward (`training_step`)."""
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    count_reads["n"], count_reads["where"], count_reads["on"] = 0, [], True
    try:
        loss = trainer.training_step(trainer.model, batch, num_items_in_batch=trainer._get_num_items_in_batch(
            [batch], trainer.args.device))
    finally:
        count_reads["on"] = False
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad(set_to_none=True)
    return count_reads["n"], loss, grads


def test_a_training_step_reads_nothing_from_the_device(tmp_path, count_reads):
    """CPU's attention (dense mask, split SDPA) with CUDA's sync-free loss: forward, loss and backward."""
    trainer, _, data = _trainer(tmp_path)
    assert trainer.args.logging_nan_inf_filter is False  # the Trainer's own per-step read of the loss
    clean = trainer.sbd_collator.pad([data[i] for i in (3, 8, 17, 30)])
    results = {}
    for sync_free in (False, True):
        trainer.sync_free = sync_free
        batch = trainer.build_batch(clean, 0)
        results[sync_free] = _step_reads(trainer, batch, count_reads)
    reads, loss, grads = results[True]
    assert reads == 0, count_reads["where"]
    # the test can fail: the default step (a CPU's) reads the labelled positions' count and indexes by them
    assert results[False][0] > 0
    # and both compute the same loss and gradients
    assert abs(loss.item() - results[False][1].item()) <= 1e-5 * max(1.0, abs(loss.item()))
    for name, g in results[False][2].items():
        assert torch.allclose(grads[name], g, atol=1e-6, rtol=1e-4), name


@pytest.mark.parametrize("mode", ["sbd", "ntp"])
def test_a_flex_forward_and_loss_read_nothing_from_the_device(tmp_path, monkeypatch, flex_compiles, count_reads,
                                                              mode):
    """CUDA's path (BlockMask built by the trainer, bucketed, labelled rows found on the host), forward and
    loss on CPU: no read (the backward has no reads of ours; flex_attention has none on CPU)."""
    trainer, data = _flex_trainer(tmp_path, monkeypatch, mode)
    clean = trainer.sbd_collator.pad([data[i] for i in (3, 8, 17, 30)])
    reads, losses = {}, {}
    for sync_free in (True, False):
        trainer.sync_free = sync_free
        batch = trainer.build_batch(clean, 0)
        count = trainer._get_num_items_in_batch([batch], trainer.args.device)
        with torch.no_grad():
            trainer.compute_loss(trainer.model, batch, num_items_in_batch=count)  # compiles: not counted
            count_reads["n"], count_reads["where"], count_reads["on"] = 0, [], True
            losses[sync_free] = trainer.compute_loss(trainer.model, batch, num_items_in_batch=count)
            count_reads["on"] = False
        reads[sync_free] = (count_reads["n"], count_reads["where"])
    assert reads[True][0] == 0, reads[True][1]
    assert reads[False][0] > 0  # the test can fail: a CPU's step counts and indexes the labelled positions
    assert abs(losses[True].item() - losses[False].item()) <= 1e-5 * max(1.0, abs(losses[False].item()))


def test_labelled_rows_pick_the_labelled_positions_in_order():
    labels = torch.tensor([[-100, 5, -100, 7], [-100, -100, -100, -100], [1, 2, 3, -100]])
    positions, select = attention.labelled_rows(labels)
    assert positions.shape == (3, 3)
    flat = torch.gather(labels, 1, positions).flatten()[select]
    assert flat.tolist() == labels[labels != -100].tolist() == [5, 7, 1, 2, 3]


def test_a_nonfinite_loss_still_stops_the_run_naming_its_step(tmp_path):
    """The loss is no longer read at every micro-batch: it is checked with the gradient norms, before every
    log line and checkpoint and at the end, and the first bad step is named (its loss before its norm)."""
    from transformers import TrainerCallback

    from sbd.errors import SBDError

    class Poison(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            if state.global_step + 1 == 3:
                with torch.no_grad():
                    model.get_output_embeddings().weight.fill_(float("nan"))

    trainer, _, _ = _trainer(tmp_path, steps=5)
    trainer.add_callback(Poison())
    with pytest.raises(SBDError, match=r"^the loss became nan at step 3; stopped, nothing saved after it"):
        trainer.train()
    assert trainer.state.global_step == 5  # read once, at the end: no checkpoint or log line came before
