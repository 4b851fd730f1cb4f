"""What a newcomer trips on (issue 40), one test each: hybrid models' captions and links, the
patching and ablation read-outs, the head search's default key, the demo atlas's first visit."""

from __future__ import annotations

import dataclasses

import hybrids_tiny
from apptest import TEXT, new_app, ok, titled

from ui import models
from ui.mixers import BLOCK_KEY

hybrids_tiny.register()
QWEN = "hybrid:qwen3_5_text"  # blocks: Gated DeltaNet, attention, Gated DeltaNet, attention
SUM_TO_ONE = "each row's weights sum to 1"


def _captions(at) -> list[str]:
    return [c.value for c in at.caption]


def test_a_signed_block_says_what_red_and_blue_mean_and_not_that_rows_sum_to_1(env):
    at = new_app(model=QWEN, text=TEXT).run()  # block 0: Gated DeltaNet
    ok(at)
    lines = _captions(at)
    assert not [c for c in lines if SUM_TO_ONE in c]  # caught: the softmax line above signed maps
    assert [c for c in lines if "**red** = a positive weight" in c and "rows do not sum to 1" in c]
    at.selectbox(key=BLOCK_KEY).set_value(3).run()  # an attention block: the softmax line again
    ok(at)
    assert [c for c in _captions(at) if SUM_TO_ONE in c]
    assert not [c for c in _captions(at) if "**red**" in c]


def test_a_hybrid_is_described_by_its_blocks_not_as_one_layer_model(env):
    lay = hybrids_tiny.loaded("qwen3_5_text").layout
    one = dataclasses.replace(
        lay, attention_layers=(3,), n_layers=1, mixers=(("gated_delta",),) * 3 + (("attention",),)
    )
    line = models.describe_layout(one)
    assert "1 layers" not in line  # caught: "1 layers × 4 heads" for a 4-block model
    assert "4 blocks: Gated DeltaNet in blocks 0, 1, 2; softmax attention in block 3" in line
    assert line.index("4 blocks") < line.index("softmax attention: 1 layer × 4 heads")


def test_an_attention_block_is_captioned_by_its_block_as_its_titles_are(env):
    at = new_app(model=QWEN, text=TEXT).run()
    at.selectbox(key=BLOCK_KEY).set_value(3).run()
    ok(at)
    assert titled(at, "layer 3 · head 0")  # the maps count blocks
    lines = _captions(at)
    assert not [c for c in lines if "(of 0–1)" in c]  # caught: "layer 1 (of 0–1)" beside "layer 3"
    line = next(c for c in lines if c.startswith("Block 3 is softmax attention"))
    assert "attention layer 1" in line
    assert at.query_params["block"] == "3"


def test_the_share_box_does_not_say_blocks_are_left_out_of_the_link(env):
    at = new_app(model=QWEN, text=TEXT).run()
    at.selectbox(key=BLOCK_KEY).set_value(2).run()
    ok(at)
    assert at.query_params["block"] == "2"
    assert not [c for c in _captions(at) if "blocks are not in the link" in c]  # caught: a stale note


def typed_send(monkeypatch) -> None:
    """AppTest's selectbox sends listed options only; the browser sends a typed one as its text
    (``string_value``), as this does."""
    from streamlit.proto.WidgetStates_pb2 import WidgetState
    from streamlit.testing.v1.element_tree import Selectbox

    def send(self) -> WidgetState:
        ws = WidgetState()
        ws.id = self.id
        if self.value is not None:
            ws.string_value = _format(self.format_func, self.value)
        return ws

    from streamlit.testing.v1.element_tree import _format_value_for_widget as _format

    monkeypatch.setattr(Selectbox, "_widget_state", property(send))


def test_a_model_typed_into_the_model_box_is_loaded_without_picking_other_first(env):
    from apptest import TINY

    at = new_app(model=TINY, text=TEXT).run()
    box = at.selectbox(key="model_choice")
    assert box.proto.accept_new_options  # caught: "No results" for a typed folder or Hub id
    typed_send(env)
    box.set_value("tiny:gpt2").run()
    ok(at)
    assert at.query_params["model"] == "tiny:gpt2"
    assert titled(at, "head 0 ")


PATCH_PAGE = "pages/6_Explain.py"
CORRUPT = "the bank of the fox"


def test_the_head_search_does_not_start_on_the_sink_column(env):
    from apptest import TINY, specs

    from ui.explain.patching import default_key

    at = new_app(PATCH_PAGE, model=TINY, text=TEXT, view="patching", corrupt=CORRUPT, over="heads").run()
    ok(at)
    assert at.selectbox(key="sk").value == -1  # auto
    search = next(s for s in specs(at) if "Head search" in (s["layout"].get("title") or {}).get("text", ""))
    title = search["layout"]["title"]["text"]
    assert "to key 0 " not in title and "to key " in title  # caught: key 0, the sink column
    assert default_key([5, 7, 9, 7], 3) == 1  # the query token's previous occurrence
    assert default_key([5, 7, 9, 8], 3) == 2  # else the token before it
    assert default_key([5], 0) == 0


def test_the_patching_progress_counts_cells_not_layers(env):
    from apptest import TINY

    from ui import progress

    lines: list[str] = []
    real = progress._bar

    def heard(run_key, first, cancel_help, line):  # every line the bar would draw
        def said(done, total, elapsed):
            lines.append(line(done, total, elapsed))
            return lines[-1]

        return real(run_key, first, cancel_help, said)

    env.setattr(progress, "_bar", heard)
    at = new_app(PATCH_PAGE, model=TINY, text=TEXT, view="patching", corrupt=CORRUPT, over="heads").run()
    ok(at)
    patching = [ln for ln in lines if ln.startswith("Patching")]
    assert patching and all(": cell " in ln for ln in patching), lines  # caught: "layer 32 of 270"


def test_a_sentence_names_the_strongest_patching_cells(env):
    import numpy as np
    import tiny
    from apptest import TINY

    import attnviz

    at = new_app(PATCH_PAGE, model=TINY, text=TEXT, view="patching", corrupt=CORRUPT, over="heads").run()
    ok(at)
    line = next((m.value for m in at.markdown if m.value.startswith("Strongest cells")), None)
    assert line, [m.value for m in at.markdown]  # caught: no sentence named them
    want = attnviz.patch(tiny.loaded("llama-gqa"), TEXT, CORRUPT, over="heads").values
    layer, head = np.unravel_index(int(np.argmax(np.abs(want))), want.shape)
    assert line.index(f"**L{layer} H{head}** ({want[layer, head]:+.2f})") == len("Strongest cells: ")
    at.segmented_control(key="pdir").set_value("noise").run()  # noising: the farthest from 1
    ok(at)
    line = next(m.value for m in at.markdown if m.value.startswith("Strongest cells"))
    noised = attnviz.patch(tiny.loaded("llama-gqa"), TEXT, CORRUPT, over="heads", direction="noise").values
    layer, head = np.unravel_index(int(np.argmax(np.abs(noised - 1))), noised.shape)
    assert f"**L{layer} H{head}**" in line.split(",")[0] and "the clean run" in line


def test_toggle_labels_wrap_instead_of_being_cut(env):
    """A toggle in a column truncates its label unless told to wrap ("Hide spe…", "Attribution
    patching (es…" at 800 and 1280 px): every toggle a page draws wraps."""
    from apptest import TINY

    for at in (
        new_app(model=TINY, text=TEXT).run(),
        new_app(PATCH_PAGE, model=TINY, text=TEXT, view="patching", corrupt=CORRUPT, over="heads").run(),
    ):
        ok(at)
        toggles = list(at.toggle)
        assert toggles and all(t.proto.wrap for t in toggles), [t.label for t in toggles if not t.proto.wrap]


def test_the_clicked_route_is_in_the_share_link(env):
    from apptest import TINY, specs

    at = new_app("pages/6_Explain.py", model=TINY, text=TEXT, thr="0.01").run()
    ok(at)
    routes = next(
        s for s in specs(at) if (s["layout"].get("title") or {}).get("text", "").startswith("Routes")
    )
    layer, head, src, dst = next(t for t in routes["data"] if t.get("customdata"))["customdata"][0]
    at.session_state["routes_chart"] = {
        "selection": {"points": [{"customdata": [layer, head, src, dst]}], "point_indices": [0]}
    }
    at.run()
    ok(at)
    assert at.query_params["edge"] == f"{layer}.{head}.{src}.{dst}"  # caught: not in the link
    shared = new_app("pages/6_Explain.py", **dict(at.query_params)).run()  # the link, elsewhere
    ok(shared)
    assert f"layer {layer}, head {head}" in shared.button(key="routes_open").label
    bad = new_app("pages/6_Explain.py", model=TINY, text=TEXT, edge="x.y").run()
    assert any("`edge`" in w.value for w in bad.warning)


def test_the_token_field_keeps_its_value_across_pages_by_streamlits_own_state(env):
    """The token field uses ``persist_state="session"`` (it was copied by hand through a
    private session key): typed on one page, it is there on the next, and in no link."""
    from apptest import TINY

    at = new_app(model=TINY, text=TEXT).run()
    at.text_input(key="hf_token").set_value("hf_secret_for_test").run()
    ok(at)
    at.switch_page("pages/1_Model_overview.py").run()
    ok(at)
    assert at.text_input(key="hf_token").value == "hf_secret_for_test"
    assert "hf_secret_for_test" not in str(dict(at.query_params))
    assert "_attnviz_session_token" not in at.session_state
