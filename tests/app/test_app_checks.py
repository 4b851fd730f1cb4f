"""The Explorer's self-check line and coloured text on real (tiny) models: what a page shows."""

from __future__ import annotations

import re

import tiny
from apptest import TINY, new_app, ok, prepare, specs, vals

TEXT = "the financial bank is located on river bank, a quick brown fox jumps over the lazy dog"
STACKS_CHECKED = re.compile(
    r"checked against eager, float32: max \|Δ\| (\S+) \(encoder layer 1\), (\S+) \(decoder layer 1\), "
    r"(\S+) \(cross layer 1\)"
)


def test_coloured_text_of_the_first_token_shows_only_itself(monkeypatch):
    """The Explorer's first view on a left-to-right model: the "Coloured text" of token 0 asks for
    one row, and token 0 can attend only to itself - weight 1 there, exactly 0 on every later token
    (a single first row once lost its causal mask and showed the later words)."""
    prepare(monkeypatch)
    for layer, head in ((0, 0), (2, 3)):
        at = new_app(model=TINY, text=TEXT, layer=layer, head=head, tok=0, tview="text").run()
        ok(at)
        assert at.number_input(key="tok").value == 0
        fig = next(s for s in specs(at) if s["data"][0].get("type") == "bar")
        assert fig["layout"]["title"]["text"].startswith("how much (0) ")
        weights = vals(fig["data"][0]["marker"]["color"])
        assert len(weights) > 10 and weights[0] == 1.0 and (weights[1:] == 0).all(), weights[:4]


def test_cli_and_explorer_show_each_stacks_check(tmp_path, capsys, monkeypatch):
    """An encoder-decoder's self-check line names the figure of each stack, in the CLI and the app."""

    from attnviz import cli

    folder = tmp_path / "tiny-bart"
    tiny.model("bart").save_pretrained(folder)
    tiny.tokenizer("seq2seq").save_pretrained(folder)
    argv = ["extract", "--model", str(folder), "--text", TEXT, "--out", str(tmp_path / "a.npz")]
    assert cli.main([*argv, "--device", "cpu", "--verify"]) == 0
    m = STACKS_CHECKED.search(capsys.readouterr().out)
    assert m and max(float(g) for g in m.groups()) <= 1e-5
    prepare(monkeypatch)
    at = new_app(model="tiny:bart", text="the bank of the river").run()
    assert not at.exception
    text = " ".join(c.value for c in at.caption)
    m = STACKS_CHECKED.search(text)
    assert m and max(float(g) for g in m.groups()) <= 1e-5, text[:600]
