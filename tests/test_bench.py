"""`sbd bench` at toy size: every method runs, the lossless ones give greedy's tokens, the eq.-16 limit
is computed from the forwards actually made, and the command writes its three files."""

import json
import math

import pytest

from sbd import SBDError
from sbd.benchmarking import Method, Shape, bench, parse_methods, time_forwards
from sbd.benchmarking.bench import VERIFY
from sbd.benchmarking.report import bench_markdown, write_bench
from sbd.cli.main import main

PROMPTS = ["The quick brown fox", "Set block decoding reveals", "12 + 34 = 46. 7"]


@pytest.fixture(scope="module")
def result(request):
    from conftest import _model, _tokenizer

    model, tok = _model("llama"), _tokenizer()
    methods = parse_methods("hf,prompt-lookup,assisted,sbd,sbd-verify,sbd-verify-lookup", [0.0, math.inf], 4,
                            assistant=True)
    return bench(model, tok, PROMPTS, methods, batch_sizes=(1, 2), repeats=1, max_new_tokens=12, assistant=model,
                 limit_repeats=1, progress=False)


def rows_of(result, batch):
    return {r.method: r for r in result.rows if r.batch_size == batch}


def test_every_method_has_a_row_and_batch_one_only_methods_skip_batches(result):
    one, two = rows_of(result, 1), rows_of(result, 2)
    assert len(one) == 8  # hf, prompt-lookup, assisted, our NTP (added), SBD γ=0, SBD γ=inf, SBD-verify (+ lookup)
    assert "sbd NTP loop" in one
    assert not any(r.kind in ("prompt-lookup", "assisted") for r in two.values())


def test_lossless_methods_give_greedy_tokens(result):
    for r in result.rows:
        if r.lossless:
            assert r.same_as_greedy == r.n == len(PROMPTS), r.method


def test_counts_and_limits_are_consistent(result):
    for b in (1, 2):
        rows = rows_of(result, b)
        ntp = rows["sbd NTP loop"]
        assert ntp.nfe == ntp.tokens and ntp.tokens_per_forward == 1.0
        assert ntp.predicted_vs_ntp == 1.0 and ntp.measured_vs_ntp == 1.0
        inf_row = next(r for r in rows.values() if r.kind == "sbd" and math.isinf(r.gamma))
        assert inf_row.nfe <= len(PROMPTS) * math.ceil(12 / 4)  # γ = ∞: one forward per block of 4
        for r in rows.values():
            assert r.seconds > 0 and r.tokens_per_second > 0 and r.speedup_vs_hf > 0
            if r.kind in ("ntp", "sbd", *VERIFY):
                assert r.limit_seconds > 0
                assert r.share_of_limit == pytest.approx(r.measured_vs_ntp / r.predicted_vs_ntp)
            else:
                assert r.nfe is None and r.limit_seconds is None


def test_report_files(result, tmp_path):
    paths = write_bench(result, tmp_path, command="sbd bench --model x")
    data = json.loads(paths["json"].read_text())
    assert len(data["rows"]) == len(result.rows) and data["command"] == "sbd bench --model x"
    md = paths["md"].read_text()
    assert md.count("## Batch size") == 2 and "SBD-verify, block 4" in md
    assert paths["png"].stat().st_size > 1000
    assert bench_markdown(result).startswith("# sbd bench")


def test_method_list_mistakes():
    with pytest.raises(SBDError, match="unknown method"):
        parse_methods("hf,beam", [0.35], 16, assistant=False)
    with pytest.raises(SBDError, match="assistant"):
        parse_methods("assisted", [0.35], 16, assistant=False)
    with pytest.raises(SBDError, match="γ"):
        parse_methods("sbd", [], 16, assistant=False)
    assert parse_methods("sbd", [0.1, 0.35], 8, assistant=False) == [
        Method("ntp"), Method("sbd", 0.1, 8), Method("sbd", 0.35, 8)]


def test_time_forwards_refuses_shapes_beyond_the_context():
    from conftest import _model

    model = _model("llama")
    times = time_forwards(model, [Shape(1, 1, 8), Shape(2, 4, 8), Shape(1, 8, 0, 8)], repeats=1, warmup=0)
    assert len(times) == 3 and all(t > 0 for t in times.values())
    with pytest.raises(SBDError, match="context"):
        time_forwards(model, [Shape(1, 16, 510)], repeats=1)


def test_time_forwards_times_a_drafting_adapter_on_the_block_as_decoding_runs_it():
    """The eq.-16 limit of an adapter model must include the adapter's cost: each timed forward gates the
    positions after its committed tokens, as the decoding loops do, and no other forward."""
    from conftest import _model, attach_random_adapter
    from sbd.drafters import adapter as adapters

    model = _model("llama")
    ad = attach_random_adapter(model)
    seen = []
    # on the embedding: every forward calls it, transformers' and sbd's own (`sbd.decoding.llama_forward`)
    hook = model.get_input_embeddings().register_forward_pre_hook(lambda module, args: seen.append((ad.start,)))
    try:
        shapes = [Shape(1, 1, 8), Shape(1, 6, 8, 2), Shape(1, 4, 8), Shape(1, 3, 8, 3)]
        time_forwards(model, shapes, repeats=1, warmup=0)
    finally:
        hook.remove()
        adapters.detach(model)
    # the prefill runs ungated; then one round of the four shapes: NTP step off, verify gated after its 2
    # committed tokens, a block of masks gated from 0, a forward without masks off
    assert seen[-4:] == [(None,), (2,), (0,), (None,)]
    assert ad.start is None


def test_time_forwards_times_the_engines_own_forward(monkeypatch):
    """"auto" shapes time what the engine runs: sbd's own forward of a Llama-family model."""
    from conftest import _model
    from sbd.decoding import llama_forward

    calls = []
    real = llama_forward.LlamaForward.__call__
    monkeypatch.setattr(llama_forward.LlamaForward, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    time_forwards(_model("llama"), [Shape(1, 1, 8), Shape(1, 4, 8), Shape(1, 4, 8, attention="dense")],
                  repeats=1, warmup=0)
    assert len(calls) == 2  # the two "auto" shapes; the dense one runs transformers with its mask


def test_command_line(tmp_path, capsys):
    from sbd.models import tiny

    tiny.create(tmp_path / "m", vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1, context=128)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The quick brown fox\n\nSet block decoding\n")
    out = tmp_path / "bench"
    code = main(["bench", "--model", str(tmp_path / "m"), "--prompts", str(prompts), "--methods", "hf,ntp,sbd",
                 "--gamma", "0,inf", "--block-size", "4", "--max-new-tokens", "6", "--repeats", "1",
                 "--batch-size", "1,2", "--out", str(out), "--no-progress"])
    assert code == 0
    assert {p.name for p in out.iterdir()} == {"bench.json", "bench.md", "bench.png"}
    assert "SBD γ=inf, block 4" in capsys.readouterr().out
    # --n takes the first N prompts of the file (all of them without it)
    for n, want in ((1, 1), (None, 2)):
        code = main(["bench", "--model", str(tmp_path / "m"), "--prompts", str(prompts), "--methods", "ntp",
                     "--max-new-tokens", "2", "--repeats", "1", "--out", str(out), "--no-progress"]
                    + (["--n", str(n)] if n else []))
        assert code == 0 and json.loads((out / "bench.json").read_text())["rows"][0]["n"] == want
    capsys.readouterr()
    assert main(["bench", "--model", str(tmp_path / "m"), "--prompts", str(tmp_path / "none.txt"),
                 "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("r", [1, 2, 3, 5, 16])
def test_fixed_schedule_reveals_r_per_forward(r):
    """reveal_per_forward=r: a block of 16 takes ⌈16/r⌉ forwards (the last block of 8: ⌈8/r⌉), left to right."""
    import sbd
    from conftest import _model, random_prompts

    model = _model("llama")
    out = sbd.generate(model, None, random_prompts(2, model.config.vocab_size), method="sbd", block_size=16,
                       max_new_tokens=40, eos_token_ids=[], reveal_per_forward=r)
    assert out.nfe == [2 * math.ceil(16 / r) + math.ceil(8 / r)] * 2
    assert out.steps[0][:16] == [1 + i // r for i in range(16)]


def test_fixed_schedule_misuse():
    import sbd
    from conftest import _model

    for kw in ({"method": "ntp", "reveal_per_forward": 2}, {"method": "sbd", "reveal_per_forward": 0}):
        with pytest.raises(SBDError, match="reveal_per_forward"):
            sbd.generate(_model("llama"), None, [[5, 6, 7]], max_new_tokens=4, **kw)


def test_bench_random_prompts_without_tokenizer():
    """What `sbd bench --shape` runs: token-id prompts, no tokenizer, fixed schedules; NFE as scheduled."""
    from conftest import _model, random_prompts

    model = _model("llama")
    methods = parse_methods("hf,ntp,sbd-fixed", [], 8, assistant=False, fixed=[2, 4])
    res = bench(model, None, random_prompts(2, model.config.vocab_size, lengths=(6, 9)), methods, repeats=1,
                max_new_tokens=16, limit_repeats=1, progress=False)
    rows = {r.method: r for r in res.rows}
    assert rows["SBD fixed 2/forward, block 8"].nfe == 2 * 8 and rows["SBD fixed 4/forward, block 8"].nfe == 2 * 4
    assert rows["sbd NTP loop"].same_as_greedy == 2 and rows["SBD fixed 4/forward, block 8"].accuracy is None


def test_narrow_linear_both_gives_an_ab_row_pair_and_leaves_the_model_as_it_was():
    """`--narrow-linear both`: every method twice (F.linear, narrow) but our NTP loop (once, as loaded);
    both rows give the same tokens; the model's layers are restored after every call."""
    from conftest import _model, random_prompts

    from sbd.models.narrow_linear import uses_narrow_linear

    model = _model("llama")
    methods = parse_methods("hf,prompt-lookup,sbd-verify", [], 4, assistant=False, narrow=[False, True])
    names = [m.name for m in methods]
    assert names.count("sbd NTP loop") == 1 and names[0] == "HF greedy generate, F.linear"  # the reference
    assert "HF greedy generate, narrow linear" in names
    assert "SBD-verify, block 4, F.linear" in names and "SBD-verify, block 4, narrow linear" in names
    assert "HF prompt-lookup (10), narrow linear" in names and len(names) == len(set(names)) == 7
    res = bench(model, None, random_prompts(2, model.config.vocab_size, lengths=(6, 9)), methods, repeats=1,
                max_new_tokens=16, limit_repeats=1, progress=False)
    rows = {r.method: r for r in res.rows}
    assert all(r.same_as_greedy == 2 for r in rows.values())
    assert rows["SBD-verify, block 4, F.linear"].nfe == rows["SBD-verify, block 4, narrow linear"].nfe
    assert rows["SBD-verify, block 4, narrow linear"].limit_seconds is not None
    assert not uses_narrow_linear(model) and res.meta["narrow_linear_as_loaded"] is False


def test_hugging_face_rows_run_stock_linear_layers_unless_asked(monkeypatch):
    """Left as loaded, Hugging Face's rows decode through torch's own linear layers (stock transformers, the
    baseline a user has without sbd) while ours keep the narrow layers sbd.load gave them; a narrow row
    of HF's exists only when asked for (`narrow=[True]`)."""
    from conftest import _model, random_prompts

    import importlib

    bench_module = importlib.import_module("sbd.benchmarking.bench")  # the module (the package exports the function)
    from sbd.models.narrow_linear import use_narrow_linear, uses_narrow_linear

    model = _model.__wrapped__("llama")  # a private copy: the shared one stays as other tests expect it
    use_narrow_linear(model)
    seen = []
    decode = bench_module._decode
    monkeypatch.setattr(bench_module, "_decode", lambda m, model, *a: seen.append((m.name, uses_narrow_linear(model)))
                        or decode(m, model, *a))
    prompts = random_prompts(2, model.config.vocab_size, lengths=(6, 9))
    bench(model, None, prompts, parse_methods("hf,prompt-lookup,sbd-verify", [], 4, assistant=False), repeats=1,
          max_new_tokens=8, limit_repeats=1, progress=False)
    as_run = dict(seen)
    assert as_run == {"HF greedy generate": False, "HF prompt-lookup (10)": False, "sbd NTP loop": True,
                      "SBD-verify, block 4": True}
    seen.clear()
    bench(model, None, prompts, parse_methods("hf", [], 4, assistant=False, narrow=[True]), repeats=1,
          max_new_tokens=8, limit_repeats=1, progress=False)
    assert dict(seen)["HF greedy generate, narrow linear"] is True
    assert uses_narrow_linear(model)


def test_a_method_pinned_to_linear_layers_gets_one_row_on_them():
    """`prompt-lookup@narrow` beside `prompt-lookup`: the stock row and one on sbd's narrow layers, whatever
    --narrow-linear says; a bad pin or a pinned NTP loop is refused in one line."""
    methods = parse_methods("hf,prompt-lookup,prompt-lookup@narrow,sbd-verify@flinear", [], 4, assistant=False)
    assert [(m.name, m.narrow) for m in methods] == [
        ("HF greedy generate", None), ("HF prompt-lookup (10)", None), ("HF prompt-lookup (10), narrow linear", True),
        ("SBD-verify, block 4, F.linear", False), ("sbd NTP loop", None)]
    both = parse_methods("prompt-lookup@narrow,sbd-verify", [], 4, assistant=False, narrow=[False, True])
    assert [m.name for m in both].count("HF prompt-lookup (10), narrow linear") == 1  # not doubled
    for bad in ("ntp@narrow", "hf@fast", "nothing@narrow"):
        with pytest.raises(SBDError):
            parse_methods(bad, [], 4, assistant=False)
