"""Every figure of README.md's "Measured" table comes from a recorded result file.

Each row links its result: a `sbd bench` folder (bench.md, read through the bench.json beside it) or a
`benchmarks/serve_load.py` report (Markdown). The row's first cell names the result's row in backticks
(`SBD-verify, block 8` as bench writes it; `sbd-verify` as the load test writes it) and its batch size
("batch 8"; 1 when not given) or its number of clients ("16 clients"). Each figure is recomputed from the
file and compared at the README's precision; "–" stands where the file records nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
COLUMNS = ["run", "tokens / forward", "vs HF greedy", "vs HF prompt-lookup", "vs sbd NTP", "same answers",
           "machine", "result"]


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every pipe table in `text`, as rows of stripped cells (the header first, the --- row dropped)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def readme_table() -> list[dict]:
    text = README.read_text()
    section = text.split("\n## Measured\n", 1)[1].split("\n## ", 1)[0]
    tables = markdown_tables(section)
    assert len(tables) == 1, "the Measured section holds one table"
    header, *rows = tables[0]
    assert header == COLUMNS
    return [dict(zip(header, (cell.replace("**", "") for cell in row))) for row in rows]


def link(cell: str) -> Path:
    match = re.fullmatch(r"\[[^\]]+\]\(([^)]+)\)", cell)
    assert match, f"the result cell {cell!r} is not one link"
    path = ROOT / match.group(1)
    assert path.is_file(), f"{match.group(1)} does not exist"
    assert path.relative_to(ROOT).parts[0] == "benchmarks" and "results" in path.relative_to(ROOT).parts
    return path


def selector(run: str) -> tuple[str, int, str]:
    """(row name, batch size or clients, which) from the first cell."""
    names = re.findall(r"`([^`]+)`", run)
    assert names, f"{run!r} names no result row in backticks"
    clients = re.search(r"(\d+) clients?\b", run)
    if clients:
        return names[-1], int(clients.group(1)), "clients"
    batch = re.search(r"\bbatch (\d+)\b", run)
    return names[-1], int(batch.group(1)) if batch else 1, "batch"


def ratio(x: float) -> str:
    return f"{x:.2f}x"


def expected_from_bench(path: Path, name: str, batch: int) -> dict:
    data = json.loads((path.parent / "bench.json").read_text())
    rows = [r for r in data["rows"] if r["batch_size"] == batch]
    by_name = {r["method"]: r for r in rows}
    assert name in by_name, f"{path.parent.name}/bench.json has no row {name!r} at batch {batch}"
    row, hf = by_name[name], by_name["HF greedy generate"]
    lookup = next((r for r in rows if r["method"].startswith("HF prompt-lookup")), None)
    meta = data["meta"]
    return {
        "tokens / forward": "–" if row["tokens_per_forward"] is None else f"{row['tokens_per_forward']:.2f}",
        "vs HF greedy": ratio(row["tokens_per_second"] / hf["tokens_per_second"]),
        "vs HF prompt-lookup": "–" if lookup is None else ratio(row["tokens_per_second"] / lookup["tokens_per_second"]),
        "vs sbd NTP": "–" if row["measured_vs_ntp"] is None else ratio(row["measured_vs_ntp"]),
        "same answers": f"{row['same_as_greedy']}/{row['n']}" + (  # a near tie: ties.py, named as bench.md names it
            f" (+{row['near_ties']} near tie{'s' * (row['near_ties'] > 1)})" if row.get("near_ties") else ""),
        "machine": f"{meta['device'].upper()}, {meta['threads']} threads",
        "prompts": meta["prompts"],
    }


def expected_from_serve_load(path: Path, name: str, clients: int) -> dict:
    text = path.read_text()
    (table,) = markdown_tables(text)
    header, *rows = table
    rows = [dict(zip(header, r)) for r in rows]
    match = [r for r in rows if r["method"] == name and int(r["clients"]) == clients]
    assert len(match) == 1, f"{path.name} has no row {name!r} at {clients} clients"
    row = match[0]
    threads = re.search(r"Device: [^,]*\b(CPU|GPU)\b[^,]*, (\d+) torch threads", text)
    assert threads, f"{path.name} does not say its device"
    return {
        "tokens / forward": "–", "vs HF greedy": "–", "vs HF prompt-lookup": "–",
        "vs sbd NTP": row["vs NTP"], "same answers": row["same answers as NTP"],
        "machine": f"{threads.group(1)}, {threads.group(2)} threads",
    }


ROWS = readme_table()


def test_the_table_has_the_demo_model_smollm2_and_the_server():
    runs = " ".join(r["run"] for r in ROWS)
    assert "demo model" in runs and "SmolLM2" in runs and "`sbd serve`" in runs


@pytest.mark.parametrize("row", ROWS, ids=[r["run"] for r in ROWS])
def test_every_figure_comes_from_its_result_file(row):
    path = link(row["result"])
    assert "Command:" in path.read_text(), f"{path.name} does not record its command"
    name, size, which = selector(row["run"])
    if path.name == "bench.md":
        assert which == "batch"
        expected = expected_from_bench(path, name, size)
        prompts = re.search(r"(\d+) (?:[a-z/]+ )*(?:problems|prompts)\b", row["run"])
        assert prompts and int(prompts.group(1)) == expected.pop("prompts"), "the row's prompt count"
    else:
        assert which == "clients"
        expected = expected_from_serve_load(path, name, size)
    for column, value in expected.items():
        assert row[column] == value, f"{column}: README says {row[column]!r}, {path.relative_to(ROOT)} gives {value!r}"


def test_a_changed_figure_is_caught():
    # the check itself can fail: one digit changed in the README's first row is refused
    row = dict(ROWS[0])
    row["vs HF greedy"] = "9" + row["vs HF greedy"][1:]
    with pytest.raises(AssertionError, match="vs HF greedy"):
        test_every_figure_comes_from_its_result_file(row)


def test_the_layout_line_is_the_order_the_layer_test_checks():
    from test_layers import LAYERS

    text = README.read_text().split("\n## Layout\n", 1)[1]
    line = next(ln for ln in text.splitlines() if "→" in ln)
    readme = [[name.strip() for name in part.split(",")] for part in line.split("→")]
    ours = [[name.removeprefix("sbd.") for name in layer] for layer in reversed(LAYERS[:-1])]
    assert readme == [[n for n in layer if not n.startswith("_")] for layer in ours]


VLLM_COLUMNS = ["engine", "prompts", "batch", "tokens/s", "vs vLLM plain", "tokens / forward", "same as vLLM plain",
                "same as fp32 greedy", "result"]


def section_rows(heading: str, columns: list[str]) -> list[dict]:
    """The rows of the one table under README's `## heading`, as dicts over its header (which must be `columns`)."""
    section = README.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    (table,) = markdown_tables(section)
    header, *rows = table
    assert header == columns
    return [dict(zip(header, (cell.replace("**", "") for cell in row))) for row in rows]


def vllm_rows() -> list[dict]:
    return section_rows("Measured inside vLLM", VLLM_COLUMNS)


def expected_from_engines(path: Path, engine: str, prompts: str, batch: str) -> dict:
    data = json.loads((path.parent / "engines.json").read_text())
    key = f"{prompts}/{'1' if batch == '1' else 'all'}"
    row, plain = data[engine][key], data["vLLM plain"][key]
    return {"tokens/s": f"{row['tok_s']:.1f}", "vs vLLM plain": ratio(row["tok_s"] / plain["tok_s"]),
            "tokens / forward": "–" if row["tpf"] is None else f"{row['tpf']:.2f}",
            "same as vLLM plain": "–" if engine == "vLLM plain" or row["same_vllm"] is None
            else f"{row['same_vllm']}/{row['n']}",
            "same as fp32 greedy": f"{row['same_own']}/{row['n']}"}


@pytest.mark.parametrize("row", vllm_rows(), ids=[f"{r['engine']} {r['prompts']} {r['batch']}" for r in vllm_rows()])
def test_every_vllm_figure_comes_from_its_result_file(row):
    path = link(row["result"])
    assert "Command:" in path.read_text(), f"{path.name} does not record its command"
    batch = "1" if row["batch"] == "1" else "all"
    for column, value in expected_from_engines(path, row["engine"], row["prompts"], batch).items():
        assert row[column] == value, f"{column}: README says {row[column]!r}, {path.relative_to(ROOT)} gives {value!r}"


PLAIN_COLUMNS = ["decoding", "γ", "gsm_symbolic acc %", "gsm_symbolic same answer", "chain_sum acc %",
                 "chain_sum same answer", "fewer forwards", "result"]
DECODINGS = {"NTP": ("ntp", False), "SBD-verify": ("sbd-verify", False), "SBD (paper)": ("sbd", False),
             "SBD anchored": ("sbd", True)}


def plain_rows() -> list[dict]:
    return section_rows("The paper's decoding on SmolLM2", PLAIN_COLUMNS)


def expected_from_eval(path: Path, decoding: str, gamma: str) -> dict:
    """The README's figures of one decoding from an `sbd eval --chat` results.json (beside results.md)."""
    rows = json.loads((path.parent / "results.json").read_text())["rows"]
    method, anchor = DECODINGS[decoding]
    g = None if gamma == "–" else float(gamma.replace("∞", "inf"))
    tasks = [r for r in rows if r["task"] != "all"]
    mine = {r["task"]: r for r in tasks if r["method"] == method and bool(r.get("anchor")) == anchor
            and (r["gamma"] if not isinstance(r["gamma"], str) else float(r["gamma"])) == g}
    ntp_forwards = sum(r["nfe"] for r in tasks if r["method"] == "ntp")
    out = {"fewer forwards": ratio(ntp_forwards / sum(r["nfe"] for r in mine.values()))}
    for task in ("gsm_symbolic", "chain_sum"):
        r = mine[task]
        out[f"{task} acc %"] = f"{100 * r['accuracy']:.1f}"
        out[f"{task} same answer"] = f"{round(r['same_answer'] * r['n'])}/{r['n']}"
    return out


@pytest.mark.parametrize("row", plain_rows(), ids=[f"{r['decoding']} {r['γ']}" for r in plain_rows()])
def test_every_plain_sbd_figure_comes_from_its_result_file(row):
    path = link(row["result"])
    assert "sbd eval" in path.read_text(), f"{path.name} does not record its command"
    for column, value in expected_from_eval(path, row["decoding"], row["γ"]).items():
        assert row[column] == value, f"{column}: README says {row[column]!r}, {path.relative_to(ROOT)} gives {value!r}"
