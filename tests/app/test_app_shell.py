"""The app's frame through AppTest: the navigation, the sidebar's model and chat switch, the
loading box, server flags, and labels that only name what a model has."""

from __future__ import annotations

import pytest
from apptest import TEXT, TINY, new_app, ok

from ui import shell


@pytest.mark.parametrize("entry", shell.PAGES, ids=lambda e: e.url_path or "explorer")
def test_every_page_is_in_the_navigation_under_its_url_path(env, entry):
    at = new_app(entry.file, model=TINY, text=TEXT).run()
    ok(at)
    titles = {"Explorer": "Attention explorer", "Model overview": "Model overview"}
    assert at.title[0].value.startswith(titles.get(entry.params.PAGE, at.title[0].value))
    assert set(at.query_params) == set(entry.params.names())
    links = [link.proto.label for link in at.sidebar.get("page_link")]
    assert links == [e.params.PAGE for e in shell.PAGES]  # the menu, on every page


def test_the_chat_switch_shows_only_for_models_with_a_chat_template(env):
    at = new_app(model=TINY, text=TEXT).run()
    ok(at)
    assert [t.key for t in at.toggle if t.key == "chat"] == ["chat"]
    at = new_app(model="tiny:bert", text=TEXT).run()
    ok(at)
    assert not [t for t in at.toggle if t.key == "chat"]
    at = new_app(model="tiny:bert", text=TEXT, chat=1).run()  # a link asking for it anyway
    assert "has no chat template; showing the plain text" in at.warning[0].value
    assert at.query_params["chat"] == "0"  # the link now says what is shown


def test_the_loading_box_goes_away_and_a_toast_says_how_long(env):
    at = new_app(model="tiny:qwen3", text=TEXT).run()
    ok(at)
    assert not at.status  # the "Loading ..." box is gone once loaded
    toasts = [t.value for t in at.toast]
    assert len(toasts) == 1 and toasts[0].startswith("Loaded `tiny:qwen3` in ")


def test_encoders_name_heads_without_kv(env):
    """No 'kv' anywhere for a model without shared K/V heads (BERT): not in the head picker, not
    in the overview's table."""
    at = new_app(model="tiny:bert", text=TEXT).run()
    ok(at)
    assert at.selectbox(key="head").options == ["head 0", "head 1", "head 2", "head 3"]
    at = new_app("pages/1_Model_overview.py", model="tiny:bert", text=TEXT).run()
    ok(at)
    assert "kv head" not in list(at.dataframe[0].value.columns)
    at = new_app("pages/1_Model_overview.py", model=TINY, text=TEXT).run()
    assert "kv head" in list(at.dataframe[0].value.columns)  # GQA: it says which KV head


def test_a_bad_server_flag_stops_every_page_with_its_name(env):
    env.setenv("ATTNVIZ_DEMO", "ture")
    at = new_app(model=TINY, text=TEXT).run()
    assert not at.exception
    assert at.error[0].value.startswith("The server is misconfigured: ATTNVIZ_DEMO='ture' is not a yes/no")
    assert not at.get("plotly_chart")
