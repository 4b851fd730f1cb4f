"""Head atlas: run many texts and rank every head of the model by each statistic across them,
with the text where each head scores highest (the model runs once per text; results are cached
on disk, so a second visit is instant)."""

import io
import time

import streamlit as st

from attnviz import AttnvizError
from attnviz import atlas as AT
from attnviz import figures as F
from attnviz.loading import cache_dir
from ui import attention, export, models, shell, state
from ui.params import AtlasParams, ExplorerParams
from ui.text import guarded, md

frame = shell.begin(AtlasParams, text_label="Text (not used here: the atlas runs its corpus)")
st.title("Head atlas")
st.caption(
    "Every head ranked by a statistic averaged over many texts, with the text where it scores "
    "highest and its strongest link there (outside the first token and the first row)."
)


def texts_to_run() -> list[str] | None:
    """The built-in corpus (its first ``ntexts``) or an uploaded file's texts."""
    p = frame.params
    source = st.segmented_control(
        "Texts", ["built-in corpus", "my file"], key="atlas_source", default="built-in corpus", required=True
    )
    if source == "my file":
        up = st.file_uploader(
            "A .txt file: one text per line, or paragraphs separated by blank lines",
            type=["txt"],
            key="atlas_file",
        )
        if up is None:
            st.info("Upload a text file to run the atlas on your own texts.")
            return None
        try:
            return AT.parse_texts(up.getvalue().decode("utf-8", errors="replace"))
        except AttnvizError as err:
            st.error(str(err))
            return None
    corpus = AT.builtin_corpus()
    state.clamp("ntexts", 1, len(corpus), "number of texts")
    n = st.slider("Texts from the built-in corpus", 1, len(corpus), key="ntexts")
    return corpus[: int(n or p.ntexts)]


def run(lm, texts: list[str]) -> AT.Atlas | None:
    """Run (or load from the disk cache) with a progress bar; a click on Cancel stops the run."""
    key = AT.cache_key(lm, texts, None, AT.ATLAS_MAX_TOKENS)
    cached = (models_cache_dir() / f"{key}.npz").exists()
    if not cached and st.session_state.get("atlas_cancel"):  # this rerun is the Cancel click's
        st.info("Cancelled: nothing was kept. Run it again when you like.", icon=":material/cancel:")
    if not cached and not st.button(f"Run the atlas on {len(texts)} texts", type="primary", key="atlas_run"):
        st.caption(
            "Each text is one forward pass; the result is cached on disk for this model and these texts."
        )
        return None
    bar = st.progress(0.0, text="Starting…")
    cancel = st.empty()
    cancel.button("Cancel", key="atlas_cancel", help="Stops the run at the next text (nothing is cached).")
    t0 = [0.0]

    def progress(done: int, total: int, note: str) -> bool:
        now = time.perf_counter()
        if done == 0:
            t0[0] = now
        eta = (now - t0[0]) / done * (total - done) if done else 0.0
        bar.progress(done / total, text=f"{note} · about {eta:.0f} s left" if done else note)
        return True

    with guarded("running the atlas", frame.token, (lm.spec,)):
        atlas = AT.run_atlas(lm, texts, progress=progress)
        bar.empty()
        cancel.empty()
        if not atlas.from_cache and not atlas.cancelled and atlas.n_texts:
            st.session_state[_JUST_RAN] = (
                (atlas.model_name, atlas.texts),
                atlas.seconds,
            )  # not "from the disk cache" after it
            st.rerun()  # drawn from the disk cache, without the run and cancel buttons
        return atlas
    return None


_JUST_RAN = "_attnviz_atlas_just_ran"  # ((model, texts), seconds) of this session's last run


def models_cache_dir():
    return cache_dir() / "atlas"


def show(atlas: AT.Atlas, explorer: ExplorerParams) -> None:
    stat = state.choose("stat", list(AT.STATISTICS), "statistic")
    stat = st.selectbox(
        "Statistic", list(AT.STATISTICS), key="stat", format_func=lambda m: attention.METRIC_NAMES.get(m, m)
    )
    ran = st.session_state.get(_JUST_RAN) or ((), 0.0)
    just_ran = ran[0] == (atlas.model_name, atlas.texts)
    seconds = float(ran[1]) if just_ran else atlas.seconds
    note = f"{atlas.n_texts} texts" + (
        " (from the disk cache)" if atlas.from_cache and not just_ran else f", {seconds:.1f} s"
    )
    if atlas.skipped:
        note += f"; {len(atlas.skipped)} skipped (over {AT.ATLAS_MAX_TOKENS} tokens or empty)"
    st.caption(note)
    fig = F.metric_heatmap(atlas.mean(stat), f"{attention.METRIC_NAMES.get(stat, stat)} · mean over texts")
    export.chart(fig, F.figure_name(atlas.model_name, "atlas", stat), key="atlas_heat")
    ranked = atlas.ranking(stat)
    examples = [atlas.example(stat, layer, head) for layer, head, _ in ranked]
    table = {
        "layer": [r[0] for r in ranked],
        "head": [r[1] for r in ranked],
        "mean": [round(r[2], 4) for r in ranked],
        "max": [round(e.value, 4) for e in examples],
        "example (strongest link in [ ])": [e.snippet for e in examples],
    }
    picked = st.dataframe(
        table, key="atlas_table", on_select="rerun", selection_mode="single-row", hide_index=True, height=380
    )
    rows = list(picked.selection.rows) if picked is not None and picked.selection else []
    i = rows[0] if rows else 0
    layer, head, ex = ranked[i][0], ranked[i][1], examples[i]
    if st.button(
        f"Open layer {layer}, head {head} on its example text in the explorer",
        key="atlas_open",
        icon=":material/open_in_new:",
    ):
        state.commit()
        target = explorer.replace(
            text=atlas.texts[ex.text_index], layer=layer, head=head, tok=max(0, ex.query)
        ).to_query()
        st.switch_page(shell.PAGES[0].file, query_params=target.params)
    df = atlas.to_frame()
    c1, c2 = st.columns(2)
    c1.download_button(
        "⬇ CSV",
        df.to_csv(index=False),
        file_name=f"{F.figure_name(atlas.model_name, 'atlas')}.csv",
        key="atlas_csv",
    )
    try:
        buf = io.BytesIO()
        df.to_parquet(buf)
        c2.download_button(
            "⬇ Parquet",
            buf.getvalue(),
            file_name=f"{F.figure_name(atlas.model_name, 'atlas')}.parquet",
            key="atlas_pq",
        )
    except ImportError:
        c2.caption("Parquet export needs pyarrow.")


def main() -> None:
    p = frame.params
    lm = shell.load(p.model, frame.token)
    st.caption(f"**{md(lm.spec)}** · {models.describe_layout(lm.layout)}")
    texts = texts_to_run()
    if not texts:
        shell.stop()
    atlas = run(lm, texts)
    if atlas is not None and atlas.n_texts:
        show(atlas, ExplorerParams(model=p.model, chat=False))
    state.share_box()


main()
