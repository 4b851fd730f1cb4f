"""The Explain page's Patching view: activation patching between the sidebar's text (clean) and a
corrupted prompt, attribution patching (an estimate, with its top cells verified by real patches)
and head search on the clean text. The engine does the work (`attnviz.explain.patching`,
`attribution_patching`, `search`); this module only draws it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import streamlit as st

from attnviz import LoadedModel, Tokens, tokenize
from attnviz import explain as X
from attnviz.explain.patch_sites import pair
from attnviz.figures import figure_name
from attnviz.figures import patching as FP
from ui import clicks, export, models, state
from ui.explain.views import computed, open_in_explorer
from ui.params import ExplainParams
from ui.text import guarded, md

MAX_UI_CELLS = 2048  # real patches per grid on the page (one forward each); the estimate has no limit
VERIFY = 20
METHODS = ("real patches", "attribution patching (estimate)")


def _marked(tokens: Tokens, differing: set[int]) -> str:
    """The prompt's tokens, those that differ from the other prompt's on a red background."""
    shown = []
    for i, tok in enumerate(tokens.display):
        text = md(tok) or "␣"
        shown.append(f":red-background[**{text}**]" if i in differing else text)
    return " · ".join(shown)


def _prompts(lm: LoadedModel, p: ExplainParams, chat: bool) -> tuple[Tokens, Tokens]:
    """Both prompts side by side with the differing tokens marked; (clean, corrupted) tokens."""
    clean = Tokens.build(lm.tokenizer, tokenize(lm, p.text, chat=chat)[0])
    corrupt = Tokens.build(lm.tokenizer, tokenize(lm, p.corrupt, chat=chat)[0])
    paired = pair(corrupt, clean)
    c1, c2 = st.columns(2)
    c1.markdown("**Clean** (the sidebar's text)")
    c1.markdown(_marked(clean, {paired.source_of(t) for t in paired.differing}))
    c2.markdown("**Corrupted**")
    c2.markdown(_marked(corrupt, set(paired.differing)))
    if paired.unpatched:
        c2.caption(
            f"Positions {', '.join(map(str, paired.unpatched))} have no partner in the clean prompt "
            "(the token alignment): they are never patched."
        )
    return clean, corrupt


def page(lm: LoadedModel, p: ExplainParams, token: str | None, chat: bool) -> None:
    """The Patching view (drawn by pages/6_Explain.py)."""
    st.text_area(
        "Corrupted prompt",
        key="corrupt",
        height=80,
        help="The same prompt with the information the answer depends on changed (names swapped, a "
        "fact replaced). The sidebar's text is the clean prompt.",
    )
    corrupt = str(state.get("corrupt") or "")
    if not corrupt.strip():
        st.info(
            "Type a corrupted prompt: the sidebar's text with a few tokens changed. Patching then copies "
            "one activation at a time from one run into the other and measures how much of the "
            "answer's logit difference comes back (0 = corrupted, 1 = clean)."
        )
        return
    p = p.replace(corrupt=corrupt)
    prompts = None
    with guarded("reading the two prompts", None, (p.text, corrupt)):
        prompts = _prompts(lm, p, chat)
    if prompts is None:
        return
    c1, c2 = st.columns([3.0, 1.3])
    over = c1.segmented_control("Patch", list(X.OVERS), key="over", required=True)
    direction = c2.segmented_control("Direction", list(X.DIRECTIONS), key="pdir", required=True)
    a1, a2 = st.columns(2)
    answer = a1.text_input("Answer token (empty: the clean prediction)", key="answer", max_chars=64)
    wrong = a2.text_input("Wrong token (empty: the corrupted prediction)", key="wrong", max_chars=64)
    estimate = st.toggle(  # its own row: in a third column its label was cut ("Attribution patching (es…")
        "Attribution patching (estimate)",
        key="pest",
        help="Every cell from two forwards and one backward (first order); its top cells are then "
        f"patched for real ({VERIFY}) and shown beside it.",
        wrap=True,
    )
    n_cells = None
    with guarded("counting the cells", None, (p.text, corrupt)):  # the grid the engine will run
        n_cells = math.prod(X.patching.planned_grid(lm, *prompts, str(over), str(direction)))
    if n_cells is None:
        return
    if not estimate and n_cells > MAX_UI_CELLS:
        st.warning(
            f"{n_cells:,} cells would be {n_cells:,} forwards; the page runs at most {MAX_UI_CELLS:,}. "
            "Turn on attribution patching (an estimate of every cell from two forwards), or patch "
            "over 'heads' or 'blocks'."
        )
        return
    key = (lm.spec, models.token_key(token), p.text, corrupt, chat, str(over), str(direction), answer, wrong)
    res = None
    # the same question to either engine call: the two texts, the tokens compared, the grid
    asked: dict[str, Any] = dict(
        answer=answer or None, wrong=wrong or None, over=str(over), direction=str(direction), chat=chat
    )
    with guarded("patching", token, (p.text, corrupt, answer, wrong)):
        if estimate:
            res = computed(
                "explain_atp",
                key,
                f"Attribution patching, then {VERIFY} real patches",
                lambda report: X.attribution_patch(
                    lm, p.text, corrupt, verify=VERIFY, progress=report, **asked
                ),
                unit="step",  # three passes, then the verification's batches
            )
        else:
            res = computed(
                "explain_patch",
                key,
                f"Patching {n_cells} cells (one forward each)",
                lambda report: X.patch(lm, p.text, corrupt, progress=report, **asked),
                unit="cell",  # one forward per cell ("layer 32 of 270" counted cells)
            )
    if res is None:
        return
    _show(lm, p, res)
    with st.expander("Head search on the clean text"):
        _search(lm, p, token, chat)


def _show(lm: LoadedModel, p: ExplainParams, res: X.Patching) -> None:
    st.caption(
        f"logit(“{md(res.answer_token)}”) − logit(“{md(res.wrong_token)}”): clean {res.clean_diff:.3f}, "
        f"corrupted {res.corrupted_diff:.3f}. "
        + (
            "**ESTIMATE**: attribution patching, a first-order approximation that can miss cells "
            "(attention saturation, cancellation); the real patches of its top cells are beside it."
            if res.estimate
            else "Each cell: one forward of the model with that one activation patched in (exact, the "
            "model's own computation)."
        )
        + (f" {res.notes[0]}." if res.notes else "")
    )
    st.markdown(strongest(res))
    fig = FP.patching_comparison_view(res) if res.estimate and res.verified else FP.patching_view(res)
    name = figure_name(lm.spec, "patching-estimate" if res.estimate else "patching")
    event = export.chart(fig, name, key="patch_chart", on_select=True, vector_key="patch_vector")
    clicked = clicks.clicked(event, "patch_chart")
    if clicked and len(clicked) >= 2 and int(clicked[1]) >= 0:
        state.remember("patch_head", (int(clicked[0]), int(clicked[1])))
    chosen = state.recall("patch_head")
    if chosen and 0 <= chosen[0] < lm.layout.n_layers and 0 <= chosen[1] < lm.layout.n_heads:
        layer, head = chosen
        last = len(res.clean) - 1
        open_in_explorer(
            p, layer, head, last, f"Open layer {layer}, head {head} in the explorer", "patch_open"
        )
    with st.expander("Cells as a table"):
        df = res.to_frame()
        st.dataframe(df, hide_index=True, height=300)
        st.download_button("⬇ CSV", df.to_csv(index=False), file_name=f"{name}.csv")


def default_key(ids: list[int], query: int) -> int:
    """The head search's key when none is chosen: the query token's latest earlier occurrence,
    else the token before the query (never the sink at 0 unless the query is token 0 or 1)."""
    earlier = [j for j in range(query) if ids[j] == ids[query]]
    return earlier[-1] if earlier else max(query - 1, 0)


def _cell_name(res: X.Patching, index: tuple[int, ...]) -> str:
    """ "L1 H2", "L0 at (3) 'fox'", "L2 mlp at (4) 'river'": a cell as the grid labels it."""
    cell = res.cell(index)
    name = f"L{cell['layer']}" + (f" H{cell['head']}" if "head" in cell else "")
    name += f" {cell['part']}" if "part" in cell else ""
    if "position" in cell:
        pos = cell["position"]
        name += f" at ({pos}) “{md(FP.res_token(res, pos))}”"
    return name


def strongest(res: X.Patching, k: int = 3) -> str:
    """One sentence naming the ``k`` cells that move the answer most, with their values on the
    grid's scale (0 = the corrupted run, 1 = the clean run): the farthest from the run patched
    into (0 when denoising the corrupted run, 1 when noising the clean one)."""
    base = 0.0 if res.direction == "denoise" else 1.0
    flat = np.nan_to_num(np.abs(res.values - base), nan=-1.0).ravel()
    top = [np.unravel_index(i, res.values.shape) for i in np.argsort(-flat, kind="stable")[:k]]
    top = [tuple(int(j) for j in t) for t in top if np.isfinite(res.values[t])]
    if not top:
        return "No cell has a value."
    parts = [f"**{_cell_name(res, t)}** ({float(res.values[t]):+.2f})" for t in top]
    what = "are estimated to move" if res.estimate else "move"
    run = "corrupted" if res.direction == "denoise" else "clean"
    return (
        f"Strongest {'cell' if len(parts) == 1 else 'cells'}: " + ", ".join(parts) + f" — patched into "
        f"the {run} run, these {what} the answer most (0 = the corrupted run's logit difference, "
        "1 = the clean run's)."
    )


def _search(lm: LoadedModel, p: ExplainParams, token: str | None, chat: bool) -> None:
    res, _ = models.extract(lm, p.text, token=token, chat=chat)
    if res is None:
        return
    n = res.n_tokens
    labels = res.tokens.display
    if not -1 <= int(state.get("sq")) < n:
        state.put("sq", -1)
    if not -1 <= int(state.get("sk")) < n:
        state.put("sk", -1)
    c1, c2 = st.columns(2)
    q = c1.selectbox("Query token", [-1, *range(n)], key="sq", format_func=lambda i: f"({i % n}) {labels[i]}")
    auto = default_key(list(res.tokens.ids), int(q) % n)
    k = c2.selectbox(
        "Key token",
        [-1, *range(n)],
        key="sk",
        format_func=lambda i: f"({i}) {labels[i]}" if i >= 0 else f"({auto}) {labels[auto]} · auto",
        help="Auto: the query token's previous occurrence, else the token before it (key 0 is the "
        "sink most heads park attention on: it ranks sink heads, not a pattern).",
    )
    k = auto if int(k) < 0 else int(k)
    found = None
    with guarded("searching the heads", None, ()):
        found = X.search_heads(res, int(q), k)
    if found is not None:
        event = export.chart(
            FP.head_search_view(found),
            figure_name(lm.spec, "head-search"),
            key="search_chart",
            on_select=True,
        )
        clicked = clicks.clicked(event, "search_chart")
        if clicked and len(clicked) >= 2:
            state.remember("search_head", (int(clicked[0]), int(clicked[1])))
        top = found.ranking(1)[0]
        layer, head = state.recall("search_head", top[:2])
        open_in_explorer(
            p, layer, head, found.query, f"Open layer {layer}, head {head} in the explorer", "search_open"
        )
    if not X.search.previous_occurrences(list(res.tokens.ids)):
        st.caption("No token of this text occurs twice: no previous-occurrence heads to look for.")
        return
    prev = X.previous_occurrence_heads(res)
    st.caption(f"Heads that attend to the previous occurrence of the current token ({md(prev.what)}):")
    st.dataframe(prev.to_frame().head(10), hide_index=True)
