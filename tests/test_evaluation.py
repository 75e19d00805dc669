"""The evaluation harness, its report and `sbd eval`: rows agree with the generate calls they come from,
accuracy is reasoning-gym's score of what was generated, speedups are NTP / SBD on the same prompts, and
mistakes are one-line SBDErrors raised before any decoding."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

import sbd
from sbd.models import tiny
from sbd.errors import SBDError
from sbd.evaluation import evaluate, harness, write_report
from sbd.cli.eval import add_eval_parser, cmd_eval, parse_gammas
from sbd.decoding import GenerationResult
from sbd.tasks import make_split, score

pytestmark = pytest.mark.filterwarnings("ignore:max_new_tokens=.*shorter than the longest reference")

ROW_FIELDS = {"task", "label", "method", "gamma", "block_size", "n", "accuracy", "exact_match", "correct", "mean_nfe",
              "nfe", "tokens", "mean_tokens", "tokens_per_forward", "seconds", "seconds_runs", "tokens_per_second",
              "nfe_speedup", "wallclock_speedup", "truncated", "reference_tokens", "max_new_tokens",
              "batch_size", "repeats", "seed"}
TASKS = ["chain_sum", "word_sequence_reversal"]
WRONG = "1 + 1 = 2\nAnswer: none"  # scores 0 (a wrong number can earn partial credit from reasoning-gym)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and on a busy 2-core machine its spin-waits cost
    seconds per test; restored afterwards for the other test modules."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("eval") / "tiny"
    tiny.create(path, vocab_size=300, hidden=32, layers=2, heads=4, kv_heads=2, context=512)
    return path


@pytest.fixture(scope="module")
def loaded(model_dir):
    return sbd.load(model_dir)


def _by(rows, task, method, gamma=None):
    [row] = [r for r in rows if r["task"] == task and r["method"] == method and r["gamma"] == gamma]
    return row


def test_rows_agree_with_independent_generate_calls(loaded):
    model, tok = loaded
    with pytest.warns(UserWarning, match="shorter than the longest reference"):
        rows = evaluate(model, tok, TASKS, n=3, gammas=[0.5, 0], block_size=4, max_new_tokens=10, batch_size=2,
                        progress=False, label="tiny")
    assert len(rows) == 3 * (len(TASKS) + 1)
    assert all(ROW_FIELDS <= set(r) for r in rows)
    for task in TASKS:
        prompts = [ex["prompt"] for ex in make_split(task, "test", 3, 0)]
        entries = [ex["entry"] for ex in make_split(task, "test", 3, 0)]
        ref = {}
        for method, gamma in (("ntp", None), ("sbd", 0.5), ("sbd", 0.0)):
            kw = {"gamma": gamma, "block_size": 4} if method == "sbd" else {}
            outs = [sbd.generate(model, tok, [p], method=method, max_new_tokens=10, **kw) for p in prompts]
            row = _by(rows, task, method, gamma)
            nfe = sum(o.nfe[0] for o in outs)
            tokens = sum(len(o.token_ids[0]) for o in outs)
            scores = [score(task, e, o.texts[0]) for e, o in zip(entries, outs)]
            assert (row["nfe"], row["tokens"], row["n"]) == (nfe, tokens, 3)
            assert row["mean_nfe"] == pytest.approx(nfe / 3)
            assert row["tokens_per_forward"] == pytest.approx(tokens / nfe)
            assert row["accuracy"] == pytest.approx(sum(scores) / 3)
            assert row["block_size"] == (4 if method == "sbd" else None)
            ref[(method, gamma)] = nfe
        for gamma in (0.5, 0.0):
            expected = ref[("ntp", None)] / ref[("sbd", gamma)]
            assert _by(rows, task, "sbd", gamma)["nfe_speedup"] == pytest.approx(expected)
        assert _by(rows, task, "ntp")["nfe_speedup"] == 1.0 and _by(rows, task, "ntp")["wallclock_speedup"] == 1.0
        assert _by(rows, task, "ntp")["tokens_per_forward"] == 1.0  # NTP: one forward per generated token
    for method, gamma in (("ntp", None), ("sbd", 0.5)):
        total, parts = _by(rows, "all", method, gamma), [_by(rows, t, method, gamma) for t in TASKS]
        assert total["nfe"] == sum(p["nfe"] for p in parts) and total["n"] == 6
        assert total["accuracy"] == pytest.approx(sum(p["accuracy"] for p in parts) / len(parts))
        assert total["seconds"] == pytest.approx(sum(p["seconds"] for p in parts))
    assert _by(rows, "all", "sbd", 0.5)["nfe_speedup"] == pytest.approx(
        _by(rows, "all", "ntp")["nfe"] / _by(rows, "all", "sbd", 0.5)["nfe"])


def test_totals_are_rebuilt_for_merged_rows(loaded, monkeypatch):
    model, tok = loaded
    rows = []
    for task in TASKS:
        fake, _ = _fake_generate(task, {0}, tok, [])
        monkeypatch.setattr(harness, "generate", fake)
        rows += evaluate(model, tok, [task], n=4, gammas=[0.2], progress=False)
    tasks_only = [r for r in rows if r["task"] != "all"]
    totals = [r for r in harness.add_totals(tasks_only) if r["task"] == "all"]
    assert [(r["method"], r["n"]) for r in totals] == [("ntp", 8), ("sbd", 8)]
    ntp, sbd_total = totals
    assert sbd_total["nfe_speedup"] == pytest.approx(ntp["nfe"] / sbd_total["nfe"])
    assert ntp["accuracy"] == pytest.approx(sum(r["accuracy"] for r in tasks_only if r["method"] == "ntp") / 2)
    assert harness.add_totals(rows) == rows  # nothing added where "all" rows exist


def test_gamma_inf_takes_one_forward_per_block(loaded):
    model, tok = loaded
    rows = evaluate(model, tok, ["number_sorting"], n=4, gammas=[math.inf], block_size=4, include_ntp=False,
                    max_new_tokens=11, progress=False, keep_outputs=True)
    row = _by(rows, "number_sorting", "sbd", math.inf)
    blocks = [math.ceil(o["tokens"] / 4) for o in row["outputs"]]
    assert row["mean_nfe"] == pytest.approx(sum(blocks) / 4)
    assert all(o["nfe"] == b for o, b in zip(row["outputs"], blocks))
    assert row["nfe_speedup"] is None and row["wallclock_speedup"] is None  # no NTP run to compare with


def test_verify_row_has_ntp_answers_and_its_acceptance(loaded):
    model, tok = loaded
    rows = evaluate(model, tok, ["number_sorting"], n=3, gammas=[], block_size=4, include_verify=True,
                    max_new_tokens=10, progress=False, keep_outputs=True)
    ntp, ver = _by(rows, "number_sorting", "ntp"), _by(rows, "number_sorting", "sbd-verify", None)
    assert [o["text"] for o in ver["outputs"]] == [o["text"] for o in ntp["outputs"]]
    assert ver["accuracy"] == ntp["accuracy"] and ver["block_size"] == 4 and ver["nfe"] <= ntp["nfe"]
    # each forward yields the drafts it kept + 1 token (fewer in the last one, cut at EOS or the budget)
    assert ver["tokens"] <= ver["nfe"] * (1 + ver["mean_accepted"]) + 1e-9
    assert "mean_accepted" not in ntp


def _fake_generate(task, wrong: set[int], tok, calls):
    """A stand-in for sbd.generate: the reference completion for items not in `wrong`, a wrong answer for
    the others; NFE = tokens (NTP) or 4 per block (SBD); seconds 1.0 per prompt (NTP), 0.25 (SBD), with
    the second timed SBD repeat of every task an outlier of 100 s that the median must ignore."""
    examples = make_split(task, "test", 4, 0)
    index = {ex["prompt"]: i for i, ex in enumerate(examples)}

    def generate(model, tokenizer, prompts, *, method, max_new_tokens, **kw):
        calls.append(method)
        texts, ids = [], []
        for p in prompts:
            i = index[p]
            texts.append(examples[i]["completion"] if i not in wrong else WRONG)
            ids.append(tok(texts[-1]).input_ids[: max_new_tokens - 1] + [tok.eos_token_id])
        nfe = [len(t) if method == "ntp" else math.ceil(len(t) / 4) for t in ids]
        n_sbd = calls.count("sbd")
        seconds = len(prompts) * (1.0 if method == "ntp" else (100.0 if n_sbd == 3 else 0.25))
        return GenerationResult(texts, ids, nfe, [list(range(1, len(t) + 1)) for t in ids], seconds, method)

    return generate, examples


def test_accuracy_speedups_and_median_from_scripted_outputs(loaded, monkeypatch):
    model, tok = loaded
    calls: list[str] = []
    fake, examples = _fake_generate("chain_sum", {1, 2, 3}, tok, calls)
    monkeypatch.setattr(harness, "generate", fake)
    rows = evaluate(model, tok, ["chain_sum"], n=4, gammas=[0.1], block_size=4, max_new_tokens=256, batch_size=4,
                    repeats=3, progress=False)
    assert calls == ["ntp", "sbd"] + ["ntp", "sbd"] * 3  # one warm-up each, then repeats interleaved
    ntp, sbd_row = _by(rows, "chain_sum", "ntp"), _by(rows, "chain_sum", "sbd", 0.1)
    for row in (ntp, sbd_row):
        assert row["accuracy"] == 0.25 and row["exact_match"] == 0.25 and row["correct"] == 1
    assert sbd_row["seconds_runs"] == [1.0, 400.0, 1.0] and sbd_row["seconds"] == 1.0  # median, outlier dropped
    assert sbd_row["wallclock_speedup"] == pytest.approx(4.0)
    tokens = [len(tok(ex["completion"]).input_ids) + 1 for ex in examples]
    tokens[1:] = [len(tok(WRONG).input_ids) + 1] * 3
    assert ntp["nfe"] == sum(tokens)
    assert sbd_row["nfe_speedup"] == pytest.approx(sum(tokens) / sum(math.ceil(t / 4) for t in tokens))
    assert sbd_row["tokens_per_second"] == pytest.approx(sum(tokens) / 1.0)
    assert ntp["truncated"] == 0


def test_reference_completions_score_full_marks(loaded, monkeypatch):
    model, tok = loaded
    fake, _ = _fake_generate("chain_sum", set(), tok, [])
    monkeypatch.setattr(harness, "generate", fake)
    rows = evaluate(model, tok, ["chain_sum"], n=4, gammas=[], progress=False)
    assert [r["accuracy"] for r in rows] == [1.0, 1.0]  # the task row and the "all" row


def _two_model_rows(loaded, monkeypatch):
    """Rows as the experiment makes them: an NTP-only baseline and an SBD model at several γ."""
    model, tok = loaded
    fake, _ = _fake_generate("chain_sum", {0}, tok, [])
    monkeypatch.setattr(harness, "generate", fake)
    base = evaluate(model, tok, ["chain_sum"], n=4, gammas=[], progress=False, label="ntp-trained")
    fake, _ = _fake_generate("chain_sum", {3}, tok, [])
    monkeypatch.setattr(harness, "generate", fake)
    return base + evaluate(model, tok, ["chain_sum"], n=4, gammas=[0, 0.35, math.inf], progress=False,
                           label="sbd-trained")


def test_report_files(loaded, monkeypatch, tmp_path):
    rows = _two_model_rows(loaded, monkeypatch)
    paths = write_report(rows, tmp_path / "out", {"label": "two models", "command": "sbd eval ..."})
    data = json.loads(paths["json"].read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert len(data["rows"]) == len(rows) and data["rows"][-1]["gamma"] == "inf"
    for key in ("platform", "cpu_count", "torch_threads", "torch", "transformers", "date", "command", "label"):
        assert key in data["meta"]
    md = paths["markdown"].read_text()
    summary = md.split("## Summary")[1].split("## Per task")[0]
    lines = [line for line in summary.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(lines) == 1 + 5  # header + ntp-trained/NTP, sbd-trained/NTP and SBD at three γ
    assert any(line.startswith("| sbd-trained | SBD | ∞ |") for line in lines)
    assert "chain_sum acc %" in lines[0] and "wall-clock×" in lines[0] and "tokens/s" in lines[0]
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("kwargs,message", [
    ({"tasks": ["no_such_task"]}, "unknown task"),
    ({"tasks": []}, "non-empty"),
    ({"n": 0}, "n must be"),
    ({"gammas": [-1.0]}, ">= 0"),
    ({"gammas": [float("nan")]}, ">= 0"),
    ({"gammas": ["0.1"]}, ">= 0"),
    ({"block_size": 0}, "block_size"),
    ({"repeats": 0}, "repeats"),
    ({"gammas": [], "include_ntp": False}, "nothing to evaluate"),
])
def test_bad_inputs_fail_before_decoding(loaded, monkeypatch, kwargs, message):
    model, tok = loaded
    monkeypatch.setattr(harness, "generate", lambda *a, **k: pytest.fail("decoded despite a bad input"))
    args = {"tasks": ["chain_sum"], "n": 2, "gammas": [0.1], **kwargs}
    with pytest.raises(SBDError, match=message):
        evaluate(model, tok, progress=False, **args)


def test_model_without_mask_token(loaded, monkeypatch):
    model, tok = loaded
    monkeypatch.setattr(model.config, "sbd_mask_token_id", None)
    with pytest.raises(SBDError, match="no SBD mask token.*NTP only"):
        evaluate(model, tok, ["chain_sum"], n=1, gammas=[0.1], progress=False)
    rows = evaluate(model, tok, ["chain_sum"], n=1, gammas=[], max_new_tokens=4, progress=False)  # NTP still works
    assert [r["method"] for r in rows] == ["ntp", "ntp"]


def test_parse_gammas():
    assert parse_gammas("0,0.1, 0.35,inf") == [0.0, 0.1, 0.35, math.inf]
    assert parse_gammas("none") == []
    for bad in ("0,abc", "0;0.1", "-1", "nan", "0,,1"):
        with pytest.raises(SBDError, match="γ"):
            parse_gammas(bad)


def _parser():
    parser = argparse.ArgumentParser(prog="sbd")
    add_eval_parser(parser.add_subparsers(dest="command"))
    return parser


def test_cmd_eval_end_to_end(model_dir, tmp_path, capsys):
    out = tmp_path / "report"
    args = _parser().parse_args(["eval", "--model", str(model_dir), "--task", "chain_sum,number_sorting",
                                 "--n", "2", "--gamma", "0.5,inf", "--block-size", "4", "--max-new-tokens", "8",
                                 "--out", str(out), "--no-progress", "--threads", "1"])
    paths = cmd_eval(args)
    printed = capsys.readouterr().out
    assert "| tiny | SBD | ∞ |" in printed and str(paths["plot"]) in printed
    data = json.loads(paths["json"].read_text())
    assert len(data["rows"]) == 3 * 3 and {r["label"] for r in data["rows"]} == {"tiny"}
    assert data["meta"]["command"].startswith("sbd eval --model") and "--gamma 0.5,inf" in data["meta"]["command"]
    assert data["meta"]["dtype"] == "float32" and data["meta"]["torch_threads"] == 1
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG" and "--threads 1" in data["meta"]["command"]


@pytest.mark.parametrize("argv,message", [
    (["--gamma", "0.1,fast"], "does not parse"),
    (["--task", "chain_sum,nope"], "unknown task"),
    (["--n", "0"], "must be >= 1"),
])
def test_cli_argument_errors(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["eval", "--model", "m", "--out", str(tmp_path), "--task", "chain_sum", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_no_ntp_without_gamma_is_an_error(tmp_path):
    args = _parser().parse_args(["eval", "--model", "/no/such", "--task", "chain_sum", "--gamma", "none",
                                 "--no-ntp", "--out", str(tmp_path)])
    with pytest.raises(SBDError, match="nothing to evaluate"):
        cmd_eval(args)


def test_every_option_has_help():
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["eval"]
    for action in sub._actions:
        assert action.help, f"{action.option_strings} has no help text"


@pytest.mark.parametrize("text,answer", [
    ("Step 1 ...\nAnswer: 42\nmore", "42"),  # an Answer: line wins over later numbers
    ("She pays 3 x $400 = $1,200.00 in all.", "1200"),
    ("So the total is 17.5 apples.", "17.5"),
    ("The difference is -8.", "-8"),
    ("I do not know.", None),
    ("", None),
])
def test_final_answer_of_a_free_form_reply(text, answer):
    from sbd.tasks import final_answer

    assert final_answer(text) == answer


def _scripted_by_method(task, wrong: dict[str, set[int]], tok):
    """A stand-in for sbd.generate whose wrong items depend on the method."""
    examples = make_split(task, "test", 4, 0)
    index = {ex["prompt"]: i for i, ex in enumerate(examples)}

    def generate(model, tokenizer, prompts, *, method, max_new_tokens, **kw):
        texts = [examples[index[p]]["completion"] if index[p] not in wrong[method] else WRONG for p in prompts]
        ids = [tok(t).input_ids[: max_new_tokens - 1] + [tok.eos_token_id] for t in texts]
        return GenerationResult(texts, ids, [len(t) for t in ids], [[1] for _ in ids], 0.5, method)

    return generate


def test_agreement_with_ntp_counts_final_answers_and_tokens(loaded, monkeypatch):
    model, tok = loaded
    monkeypatch.setattr(harness, "generate", _scripted_by_method("chain_sum", {"ntp": {1}, "sbd": {1, 2}}, tok))
    rows = evaluate(model, tok, ["chain_sum"], n=4, gammas=[0.5], block_size=4, max_new_tokens=256, progress=False)
    ntp, sbd_row = _by(rows, "chain_sum", "ntp"), _by(rows, "chain_sum", "sbd", 0.5)
    assert ntp["same_answer"] == 1.0 and ntp["same_tokens"] == 1.0
    # item 1 is wrong both ways (the same answer), item 2 only under SBD
    assert sbd_row["same_answer"] == 0.75 and sbd_row["same_tokens"] == 0.75
    assert sbd_row["answers"][2] == "none" and ntp["answers"][2] == make_split("chain_sum", "test", 4, 0)[2]["answer"]
    [total] = [r for r in rows if r["task"] == harness.ALL_TASKS and r["method"] == "sbd"]
    assert total["same_answer"] == 0.75


def test_chat_eval_asks_the_bare_question_through_the_template(loaded):
    import copy

    model, tok = loaded
    tok = copy.deepcopy(tok)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    rows = evaluate(model, tok, ["chain_sum"], n=2, gammas=[0.5], block_size=4, include_verify=True,
                    max_new_tokens=12, progress=False, chat=True)
    questions = [ex["entry"]["question"] for ex in make_split("chain_sum", "test", 2, 0)]
    direct = sbd.generate(model, tok, questions, method="ntp", max_new_tokens=12, temperature=0.0, chat=True)
    ntp = _by(rows, "chain_sum", "ntp")
    assert ntp["token_ids"] == direct.token_ids and ntp["chat"] is True
    from sbd.tasks import final_answer

    assert ntp["answers"] == [final_answer(t) for t in direct.texts]
    verify = _by(rows, "chain_sum", "sbd-verify")
    assert verify["same_tokens"] == 1.0 and verify["same_answer"] == 1.0  # verified drafts: NTP's own tokens


def test_cmd_eval_adapter_and_chat_options(model_dir, tmp_path):
    args = _parser().parse_args(["eval", "--model", str(model_dir), "--adapter", str(tmp_path), "--task",
                                 "chain_sum", "--chat", "--verify", "--out", str(tmp_path / "r")])
    from sbd.cli.eval import command_line

    line = command_line(args)
    assert f"--adapter {tmp_path}" in line and "--chat" in line and "--verify" in line
    with pytest.raises(SBDError, match="adapter"):  # an empty folder is no adapter: one line, before decoding
        cmd_eval(args)
