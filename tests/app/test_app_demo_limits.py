"""Demo limits on every entry point: a plugin-style spec meets the allow-list like any other name,
and every page honours the demo token cap (a refusal that says so, or the first N tokens with a
warning; never a figure of more tokens than the cap)."""

from __future__ import annotations

import pytest
from apptest import TINY, new_app, specs

import attnviz
from attnviz.server import specs as S
from attnviz.server.settings import Settings

CAP = 8
LONG = "the bank of the river " * 5  # 26 words: well past the cap


def test_a_plugin_spec_meets_the_allow_list_before_its_loader():
    """Caught: the plugin lookup moved ahead of the allow-list (any registered prefix served)."""
    made: list[str] = []
    S.register("fakedemo", lambda name: made.append(name) or name, "fake")  # type: ignore[func-returns-value]
    try:
        demo = Settings(demo=True, allowed_models=("fakedemo:ok",), max_tokens=CAP)
        assert S.resolve("fakedemo:ok", demo).source == "plugin"
        for refused in ("fakedemo:other", "fakedemo:", "fakedemo:ok ", "smollm2-135m", "owner/model"):
            if refused.strip() == "fakedemo:ok":
                continue
            with pytest.raises(attnviz.NotAllowed, match="only serves fakedemo:ok"):
                S.resolve(refused, demo)
        assert S.resolve(" fakedemo:ok ", demo).spec == "fakedemo:ok"  # the same name, trimmed
        assert made == []  # resolving never loads
    finally:
        S.unregister("fakedemo")


@pytest.fixture
def demo(env):
    env.setenv("ATTNVIZ_DEMO", "1")
    env.setenv("ATTNVIZ_ALLOWED_MODELS", TINY)
    env.setenv("ATTNVIZ_MAX_TOKENS", str(CAP))
    return env


def widest_axis(at) -> int:
    """The most token positions any drawn heatmap has along an axis."""
    n = 0
    for spec in specs(at):
        for t in spec["data"]:
            for axis in ("x", "y"):
                values = t.get(axis)
                if isinstance(values, list) and all(isinstance(v, str) for v in values):
                    n = max(n, len(values))
    return n


REFUSING = [
    ("pages/0_Explorer.py", {}),
    ("pages/1_Model_overview.py", {}),
    ("pages/3_Compare.py", {"text2": "the bank"}),
    ("pages/3_Compare.py", {"text": "the bank", "text2": LONG}),
    ("pages/4_Generation.py", {}),
    ("pages/6_Explain.py", {"view": "routes"}),
    ("pages/6_Explain.py", {"view": "ablation", "abl": "0.0"}),
]


@pytest.mark.parametrize(("page", "extra"), REFUSING, ids=[f"{p[6:-3]}-{'-'.join(e)}" for p, e in REFUSING])
def test_every_page_refuses_a_text_over_the_demo_cap(demo, page, extra):
    """Caught: the Explain trace run without the server's cap (its own 4,096-token default)."""
    at = new_app(page, **{"model": TINY, "text": LONG, **extra}).run()
    assert not at.exception, [e.value for e in at.exception]
    said = [e.value for e in at.error]
    assert any(f"the limit is {CAP}" in m or f"reads at most {CAP} " in m for m in said), said
    assert widest_axis(at) <= CAP


def test_generating_the_whole_cap_offers_no_empty_prompt(demo):
    """Caught: "use its first 0 tokens" and a button that kept one token, when the tokens to
    generate alone fill the demo's cap."""
    at = new_app("pages/4_Generation.py", model=TINY, text=LONG, k=CAP).run()
    assert not at.exception, [e.value for e in at.exception]
    said = [e.value for e in at.error]
    assert any(f"fewer than {CAP} tokens to generate" in m for m in said), said
    assert not any("first 0" in m for m in said), said
    assert not [b for b in at.button if b.key == "first_tokens"]


def test_from_scratch_shows_only_the_first_cap_tokens(demo):
    at = new_app("pages/2_From_scratch.py", model=TINY, text=LONG).run()
    assert not at.exception
    assert any(f"the first {CAP} tokens" in w.value for w in at.warning)
    assert 0 < widest_axis(at) <= CAP


def test_the_atlas_runs_its_texts_under_the_demo_cap(demo, monkeypatch):
    from attnviz import atlas as AT
    from attnviz.atlas.run import ATLAS_MAX_TOKENS

    asked: list[int] = []

    def spy(lm, texts, **kw):
        asked.append(int(kw.get("max_tokens", ATLAS_MAX_TOKENS)))
        raise attnviz.AttnvizError("stop here")

    monkeypatch.setattr(AT, "run_atlas", spy)
    at = new_app("pages/5_Head_atlas.py", model=TINY, ntexts=1).run()
    at.button(key="atlas_run").click().run()
    assert asked and max(asked) <= CAP


def test_a_fresh_demo_atlas_visit_gives_no_range_warning(demo):
    """The default number of texts (50) is above the demo's corpus: a fresh visit clamps it
    quietly; a link that asks for more than the demo has is still told."""
    at = new_app("pages/5_Head_atlas.py", model=TINY).run()
    assert not at.exception
    assert not [w.value for w in at.warning if "out of range" in w.value]  # caught: every visit warned
    hi = at.slider(key="ntexts").max
    assert at.slider(key="ntexts").value == hi
    linked = new_app("pages/5_Head_atlas.py", model=TINY, ntexts=hi + 5).run()
    assert [w.value for w in linked.warning if "out of range" in w.value]
