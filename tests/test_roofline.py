"""The roofline: the paper's printed code reproduces its published cells; the corrected model agrees
with a hand count; eq. 16; `sbd roofline` and `sbd forward-cost` write their files."""

import json

import pytest

from sbd.benchmarking.roofline import (Hardware, ModelShape, block_speedup, forward_time, paper_block_speedup,
                                       paper_slowdown, slowdown)
from sbd.benchmarking.roofline_presets import HARDWARE, MODELS
from sbd.cli.main import main

WIDTHS = (1, 2, 4, 8, 16, 32, 64)

# Table 3 of arXiv 2509.04185, as printed: (batch, KV length) -> slowdown at k = 1, 2, 4, …, 64.
PAPER_TABLE3 = {
    (1, 2 ** 4): [1.000, 1.000, 1.001, 1.002, 1.004, 1.008, 1.015],
    (1, 2 ** 22): [1.000, 1.000, 1.001, 1.002, 1.004, 1.007, 1.029],
    (4, 2 ** 12): [1.000, 1.001, 1.003, 1.007, 1.015, 1.030, 1.062],
    (4, 2 ** 22): [1.000, 1.001, 1.003, 1.006, 1.014, 1.028, 1.111],
    (8, 2 ** 8): [1.000, 1.002, 1.006, 1.014, 1.029, 1.060, 1.903],
    (8, 2 ** 22): [1.000, 1.002, 1.005, 1.012, 1.026, 1.054, 1.904],
    (16, 2 ** 10): [1.000, 1.004, 1.012, 1.027, 1.058, 1.899, 3.799],
    (16, 2 ** 16): [1.000, 1.004, 1.012, 1.027, 1.058, 1.896, 3.792],
    (16, 2 ** 20): [1.000, 1.004, 1.011, 1.026, 1.055, 1.847, 3.688],
    (16, 2 ** 22): [1.000, 1.003, 1.009, 1.022, 1.047, 1.720, 3.422],
}
# Table 4: (NFE speedup, batch, KV length) -> wall-clock speedup at k = 8, 16, 32, 64.
PAPER_TABLE4 = {
    (2, 1, 2 ** 4): [1.996, 1.992, 1.984, 1.969],
    (2, 4, 2 ** 22): [1.984, 1.969, 1.935, 1.755],
    (2, 8, 2 ** 16): [1.966, 1.936, 1.797, 1.019],
    (4, 1, 2 ** 22): [3.989, 3.982, 3.960, 3.876],
    (4, 4, 2 ** 20): [3.958, 3.928, 3.863, 3.545],
    (4, 8, 2 ** 4): [3.916, 3.857, 3.431, 1.978],
    (8, 1, 2 ** 14): [7.971, 7.955, 7.924, 7.863],
    (8, 4, 2 ** 16): [7.885, 7.825, 7.705, 6.850],
    (8, 8, 2 ** 22): [7.797, 7.693, 6.318, 3.736],
}


@pytest.mark.parametrize("cell", sorted(PAPER_TABLE3))
def test_paper_code_reproduces_table_3(cell):
    batch, kv = cell
    assert [round(paper_slowdown(batch, w, kv), 3) for w in WIDTHS] == PAPER_TABLE3[cell]


@pytest.mark.parametrize("cell", sorted(PAPER_TABLE4))
def test_paper_code_reproduces_table_4(cell):
    nfe, batch, kv = cell
    got = [paper_block_speedup(batch, k, kv, nfe) for k in (8, 16, 32, 64)]
    assert got == pytest.approx(PAPER_TABLE4[cell], abs=1.5e-3)  # the paper rounds one cell the other way


def test_eq_16():
    # time(w) = 1 + w/100: a block of 8 in 2 forwards costs time(16) + time(8) against 8 time(1)
    t = lambda w: 1 + w / 100  # noqa: E731
    assert block_speedup(t, 8, 4) == pytest.approx(8 * 1.01 / (1.16 + 1.08))


def test_corrected_roofline_matches_a_hand_count():
    """One layer, no attention cost to speak of, memory-bound: time = bytes / bandwidth."""
    m = ModelShape("toy", layers=1, hidden=4, heads=1, kv_heads=1, head_dim=4, intermediate=8, vocab=10,
                   weight_bytes=1, kv_bytes=1, act_bytes=1)
    hw = Hardware("toy", flops=1e30, attention_flops=1e30, bandwidth=1.0)
    # per GEMM (t=1 token): t*k + k*n + t*n bytes; q,k,v,o: 4+16+4 each; gate, up: 4+32+8; down: 8+32+4; out: 4+40+10
    gemms = 4 * 24 + 2 * 44 + 44 + 54
    attention = 2 * 1 * 4 + 2 * 1 * (3 + 1) * 4  # Q in + out, K and V of 3 cached + 1 new
    assert forward_time(m, hw, batch=1, width=1, cached=3) == pytest.approx(gemms + attention)


def test_corrected_8b_on_h100_is_memory_bound_at_batch_1():
    m, hw = MODELS["llama-3.1-8b-fp8"], HARDWARE["h100-fp8"]
    assert 1.0 < slowdown(m, hw, 1, 16, 256) < 1.01  # weights dominate: 16 tokens cost ~ 1
    assert slowdown(m, hw, 16, 64, 256) > 3  # 1024 tokens per forward: compute-bound
    assert 2e-3 < forward_time(m, hw, 1, 1, 256) < 3e-3  # ~8 GB of fp8 weights at 3.35 TB/s


def test_roofline_command(tmp_path):
    assert main(["roofline", "--batch-size", "1,16", "--cached", "256", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "roofline.json").read_text())
    assert [round(v, 3) for v in data["table3"]["paper"]["16/256"]] == PAPER_TABLE3[(16, 2 ** 10)]
    assert "| 2^8 | paper | 1.000 | 1.000 | 1.001 | 1.002 | 1.004 | 1.008 | 1.015 |" in (tmp_path / "roofline.md").read_text()
    assert (tmp_path / "roofline.png").stat().st_size > 1000


def test_forward_cost_command(tmp_path):
    from sbd.models import tiny

    tiny.create(tmp_path / "m", vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1, context=128)
    out = tmp_path / "fc"
    assert main(["forward-cost", "--model", str(tmp_path / "m"), "--widths", "1,4,16", "--batch-size", "1,2",
                 "--cached", "0,32,112", "--repeats", "2", "--hardware", "h100-bf16", "--out", str(out),
                 "--no-progress"]) == 0
    data = json.loads((out / "forward_cost.json").read_text())
    cells = {(r["batch"], r["cached"], r["width"]): r for r in data["rows"]}
    assert set(cells) == {(b, c, w) for b in (1, 2) for c in (0, 32, 112) for w in (1, 4, 16)}  # 112 + 16 = 128
    assert all(cells[(b, c, 1)]["ratio"] == 1.0 for b in (1, 2) for c in (0, 32))
    assert "roofline ×1-token" in (out / "forward_cost.md").read_text()


def test_forward_cost_refuses_a_width_beyond_the_context_naming_it(tmp_path, capsys):
    """A width that does not fit over a cached length is said, not left out of the table."""
    from sbd.benchmarking.forward_cost import forward_cost_table
    from sbd.errors import SBDError
    from sbd.models import tiny

    model, _ = tiny.create(tmp_path / "m", vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1, context=256)
    for widths, cached, needles in (([1, 300], [200], ("width 300", "200 cached", "context of 256")),
                                    ([1, 8], [100, 300], ("width 1", "300 cached", "context of 256"))):
        argv = ["forward-cost", "--model", str(tmp_path / "m"), "--widths", ",".join(map(str, widths)), "--cached",
                ",".join(map(str, cached)), "--repeats", "1", "--out", str(tmp_path / "fc"), "--no-progress"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("sbd: error:") and all(n in err[0] for n in needles), err
        with pytest.raises(SBDError, match=needles[0]):
            forward_cost_table(model, widths=widths, cached=cached, repeats=1, progress=False)
    assert not (tmp_path / "fc").exists()



def test_forward_cost_defaults_keep_the_widths_that_fit_and_say_which_they_leave(tmp_path, capsys):
    """Without --widths, a model with a short context (the demo's 272) still runs: the default widths that
    do not fit are left out, in one line on stderr; widths given by the user are refused instead (above)."""
    from sbd.models import tiny

    tiny.create(tmp_path / "m", vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1, context=272)
    out = tmp_path / "fc"
    assert main(["forward-cost", "--model", str(tmp_path / "m"), "--repeats", "1", "--out", str(out),
                 "--no-progress"]) == 0
    assert "sbd: default widths 32, 64 left out" in capsys.readouterr().err
    widths = {r["width"] for r in json.loads((out / "forward_cost.json").read_text())["rows"]}
    assert widths == {1, 2, 4, 8, 16}

def test_measured_hardware_is_plausible():
    """This machine's matmul FLOP/s and copy bandwidth: positive and below anything a CPU can do."""
    from sbd.benchmarking.hardware import measure_hardware

    hw = measure_hardware("cpu", repeats=2, n=256, copy_mib=16)
    assert 1e8 < hw.flops < 1e14 and 1e8 < hw.bandwidth < 1e13 and hw.attention_flops == hw.flops
