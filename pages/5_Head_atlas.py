"""Head atlas: run many texts and rank every head of the model by each statistic across them,
with the text where each head scores highest (the model runs once per text, here or on a Ray
cluster named by ATTNVIZ_RAY_ADDRESS; every text is saved on disk as it finishes, so a second
visit is instant and a stopped run resumes)."""

import io
import time

import streamlit as st

from attnviz import AttnvizError
from attnviz import atlas as AT
from attnviz import figures as F
from attnviz.server.settings import DEMO_ATLAS_TEXTS, settings
from ui import export, head_stats, models, shell, state
from ui.params import AtlasParams, ExplorerParams
from ui.text import code, guarded, md

frame = shell.begin(AtlasParams, text_label="Text (not used here: the atlas runs its corpus)")
st.title("Head atlas")
st.caption(
    "Every head ranked by a statistic averaged over many texts, with the text where it scores "
    "highest and its strongest link there (outside the first token and the first row)."
)


DEMO = settings().demo  # public demo: the built-in corpus's first texts only, no uploads
DEMO_CACHE_BYTES = 64 * 2**20  # the atlas's disk cache on a demo server (least recently used go)
# longer texts are skipped; a server's token cap (ATTNVIZ_MAX_TOKENS) lowers it, never raises it
MAX_TOKENS = min(AT.ATLAS_MAX_TOKENS, settings().max_tokens)


def texts_to_run() -> list[str] | None:
    """The built-in corpus (its first ``ntexts``) or an uploaded file's texts (not in the demo)."""
    p = frame.params
    source = "built-in corpus"
    if not DEMO:
        source = st.segmented_control(
            "Texts", ["built-in corpus", "my file"], key="atlas_source", default=source, required=True
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
    if DEMO:
        corpus = corpus[:DEMO_ATLAS_TEXTS]
        st.caption(f"Public demo: the first {len(corpus)} texts of the built-in corpus; no uploads.")
    # the default (50) over the demo's corpus is no one's mistake: warned only when a link asked
    state.clamp("ntexts", 1, len(corpus), "number of texts", quiet=not state.linked("ntexts"))
    n = st.slider("Texts from the built-in corpus", 1, len(corpus), key="ntexts")
    return corpus[: int(n or p.ntexts)]


def engine_choice() -> tuple[str, str | None]:
    """("local", None), or ("ray", address) when the server names a Ray cluster
    (ATTNVIZ_RAY_ADDRESS) and the user picks it."""
    address = AT.cluster_address()
    if not address or DEMO:  # the demo's model work stays in its one queue
        return "local", None
    where = st.segmented_control(
        "Run on", ["this server", "Ray cluster"], key="atlas_engine", default="this server", required=True
    )
    if where == "Ray cluster":
        st.caption(
            f"Sent to the Ray cluster at {code(address)}: one model per worker, "
            "each text saved as it finishes."
        )
        return "ray", address
    return "local", None


def run(lm, texts: list[str]) -> AT.Atlas | None:
    """Run what is not in the disk cache yet (on this server or on Ray), with a progress bar; every
    text is saved as it finishes, so Cancel (or closing the tab) loses nothing done."""
    engine, address = engine_choice()
    done, total = AT.cached_count(lm, texts, max_tokens=MAX_TOKENS)
    cancelled = done < total and bool(state.widget_value("atlas_cancel"))  # the Cancel click's rerun
    fresh = bool(state.widget_value("atlas_fresh"))  # the "Start over" click's rerun: every text again
    if cancelled:
        st.info(
            f"Cancelled: the {done} of {total} texts done so far are saved; run again to resume."
            + (" Below: the atlas of those texts." if done else ""),
            icon=":material/cancel:",
        )
    slot = st.empty()  # the run button, cleared while the run goes (a stale "Resume" is never lit)
    if done < total and not fresh:
        label = (
            f"Run the atlas on {total} texts"
            if not done
            else f"Resume the atlas ({done} of {total} texts done)"
        )
        if not slot.button(label, type="primary", key="atlas_run"):
            st.caption("Each text is one forward pass, saved on disk as it finishes (a later run resumes).")
            return saved_so_far(lm, texts) if cancelled and done else None
        slot.empty()
    bar = st.progress(0.0, text="Starting…" if engine == "local" else "Starting the Ray workers…")
    cancel = st.empty()
    if done < total:
        cancel.button("Cancel", key="atlas_cancel", help="Stops the run; the texts done so far stay saved.")
    start: list[float] = []  # time and texts done at the first call

    def progress(done: int, total: int, note: str) -> bool:
        now = time.perf_counter()
        if not start:
            start.extend((now, done))
        ran = done - start[1]
        rate = ran / (now - start[0]) if ran and now > start[0] else 0.0
        text = f"{done} of {total} texts" + (
            f" · {rate:.1f} texts/s · about {(total - done) / rate:.0f} s left" if rate else ""
        )
        bar.progress(done / max(total, 1), text=text)
        return True

    with guarded("running the atlas", frame.token, (lm.spec,)):
        # each text takes its own turn of the demo's queue (the model's gated lock), so a long
        # atlas never holds the model while other visitors wait
        try:
            atlas = AT.run_atlas(
                lm,
                texts,
                progress=progress,
                engine=engine,  # type: ignore[arg-type]
                ray_address=address,
                max_tokens=MAX_TOKENS,
                fresh=fresh,
            )
        except AT.OtherWeights:
            bar.empty()
            cancel.empty()
            st.warning(
                "The saved atlas of this model comes from other weights: the model changed since it "
                "was run, so those numbers are not this model's. Start over to compute every text "
                "again for these weights (the old results are replaced).",
                icon=":material/history:",
            )
            st.button("Start over for these weights", key="atlas_fresh", type="primary")
            return None
        if DEMO:
            AT.cache.evict(DEMO_CACHE_BYTES)
        bar.empty()
        cancel.empty()
        if atlas.cache_error:
            st.warning(atlas.cache_error)
        elif atlas.computed and not atlas.cancelled and atlas.n_texts:
            # drawn again without the run and cancel buttons, saying what this run computed
            state.remember(
                "atlas_just_ran",
                (
                    (atlas.model_name, tuple(atlas.texts)),
                    atlas.computed,
                    atlas.seconds,
                ),
            )
            st.rerun()
        return atlas
    bar.empty()
    cancel.empty()
    slot.button("Run again", key="atlas_retry", help="Texts done before the error stay saved.")
    return None


def saved_so_far(lm, texts: list[str]) -> AT.Atlas | None:
    """The atlas of the texts already on disk (after a Cancel), computing nothing: the run stops
    before its first missing text."""
    with guarded("reading the saved atlas texts", frame.token, (lm.spec,)):
        return AT.run_atlas(lm, texts, progress=lambda *_: False, max_tokens=MAX_TOKENS)
    return None


def show(atlas: AT.Atlas, explorer: ExplorerParams) -> None:
    stat = state.choose("stat", list(AT.STATISTICS), "statistic")
    stat = st.selectbox(
        "Statistic", list(AT.STATISTICS), key="stat", format_func=lambda m: head_stats.METRIC_NAMES.get(m, m)
    )
    just = state.recall("atlas_just_ran")
    if atlas.from_cache and just and just[0] == (atlas.model_name, tuple(atlas.texts)):
        note = f"{atlas.n_texts} texts, {just[1]} computed in {just[2]:.1f} s"  # this session's run
    else:
        note = f"{atlas.n_texts} texts" + (
            " (from the disk cache)"
            if atlas.from_cache
            else f", {atlas.computed} computed in {atlas.seconds:.1f} s "
            f"({atlas.engine} engine, {atlas.workers} worker(s))"
        )
    if atlas.skipped:
        note += f"; {len(atlas.skipped)} skipped: " + "; ".join(
            f"text {i + 1}: {r}" for i, r in atlas.skipped[:3]
        )
    st.caption(note)
    fig = F.metric_heatmap(atlas.mean(stat), f"{head_stats.METRIC_NAMES.get(stat, stat)} · mean over texts")
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


def mixer_heads(lm, texts: list[str]) -> None:
    """The non-softmax mixer heads over the same texts, ranked by distance back (nothing without them)."""
    from attnviz.metrics.mixer_compare import mixer_atlas, mixer_heads_of

    if not mixer_heads_of(lm.layout):
        return
    st.subheader("Mixer heads (not softmax)")
    with st.spinner("Reading the mixer heads over the texts…", show_time=True):
        try:
            found = mixer_atlas(lm, texts, max_tokens=MAX_TOKENS)
        except AttnvizError as err:
            st.error(str(err))
            return
    st.caption(
        f"Each non-softmax mixer head's exact effective attention A (signed, not probabilities), its "
        f"statistics averaged over {found.n_texts} texts"
        + (f" ({found.skipped} skipped: too long or empty)" if found.skipped else "")
        + ": distance back (|A|-weighted), self share and negative share of Σ|A| (a per-channel "
        "mixer's one head is its contribution norms: no negative share). Entropy, sink share and the "
        "induction score do not apply to these heads. Longest distance back first."
    )
    st.dataframe(found.to_frame(), hide_index=True, key="atlas_mixer_heads")


def main() -> None:
    p = frame.params
    lm = shell.load(p.model, frame.token)
    st.caption(f"**{md(lm.spec)}** · {models.describe_layout(lm.layout)}")
    texts = texts_to_run()
    if not texts:
        shell.stop()
    mixer_heads(lm, texts)  # hybrids, recurrent models: their mixer heads by the statistics that apply
    shell.need_attention(lm, "The corpus atlas of softmax heads' roles (the mixer heads are above)")
    atlas = run(lm, texts)
    if atlas is not None and atlas.n_texts:
        show(atlas, ExplorerParams(model=p.model, chat=False))
    state.share_box()


main()
