"""`attnviz bench --hybrid-explain` (attnviz/bench/hybrid_explain.py) runs end to end on a tiny
Qwen3.5-shaped hybrid: every row is timed against the same repeat's floor, the "trace + every
readout" row is the sum of its parts, and the Markdown section lands between its markers.
Correctness only: no timing is asserted (the ratios are printed)."""

from __future__ import annotations

import math

import hybrids_tiny
import pytest

from attnviz import cli
from attnviz.bench import hybrid_explain as hx

N = 40


@pytest.fixture(scope="module")
def lm():
    return hybrids_tiny.loaded("qwen3_5_text")


def test_the_prompts_differ_at_one_position_in_the_middle():
    clean, corrupted = hx.prompts(N, 384)
    assert len(clean) == len(corrupted) == N
    assert [i for i in range(N) if clean[i] != corrupted[i]] == [N // 2]


def test_bench_times_every_row_against_its_floor_and_the_total_is_the_sum_of_the_readouts(lm):
    row = hx.bench(lm, N, repeats=1)
    print(hx.markdown_row(row, 4))
    ratios = row["ratios"]
    assert set(hx.ROWS) <= set(ratios)
    assert row["n"] == N and row["floor"][0] > 0
    for name, (wall, cpu) in ratios.items():
        assert math.isfinite(wall) and wall > 0 and math.isfinite(cpu) and cpu >= 0, name
    readouts = hx.total_parts(ratios)
    assert readouts == ["trace", "lens", "dla", "routes"]  # the tiny hybrid is traced and routed
    for i in (0, 1):  # wall, CPU: one repeat, one floor, so the total's ratio is the parts' sum
        assert ratios["total"][i] == pytest.approx(sum(ratios[k][i] for k in readouts))
    cells = hx.markdown_row(row, 4).strip("|").split("|")
    assert len(cells) == len(hx.HEADER.splitlines()[0].strip("|").split("|"))
    assert cells[0].strip() == str(N) and cells[1].strip() == "4"
    shown_total = cells[3 + hx.ROWS.index("total")]
    assert ("✓" in shown_total) == (ratios["total"][1] <= hx.BUDGETS["total"])


def test_the_cli_writes_its_section_between_markers(lm, monkeypatch, tmp_path, capsys):
    seen: list[int] = []

    def tiny(blocks: int = hx.BLOCKS, vocab: int = hx.VOCAB):
        seen.append(blocks)
        return lm

    monkeypatch.setattr(hx, "qwen35_08b", tiny)
    out = tmp_path / "benchmarks.md"
    out.write_text("# Benchmarks\n\nkept text\n")
    argv = ["bench", "--hybrid-explain", str(N), "--hybrid-blocks", "4", "--repeats", "1", "--out", str(out)]
    assert cli.main(argv) == 0
    assert seen == [4]
    text = out.read_text()
    assert "kept text" in text
    start, end = "<!-- hybrid-explain-4:start -->", "<!-- hybrid-explain-4:end -->"
    section = text[text.index(start) : text.index(end)]
    assert f"\n| {N} | 4 | " in section and "medians of 1" in section
    assert hx.HEADER.splitlines()[0] in capsys.readouterr().out
