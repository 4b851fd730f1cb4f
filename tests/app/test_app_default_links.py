"""Every page's DEFAULT link parses and round-trips: the link a page writes when nobody changed
anything is read back by the same page's parameters with no problem and the same values.

(test_app_share.py checks links whose every value is away from its default; a default that its
own parser refuses, or that is written in a form it does not read, only shows here.)"""

from __future__ import annotations

import dataclasses

import pytest
from apptest import TINY, new_app

from ui import params as P

PAGES = {
    "pages/0_Explorer.py": P.ExplorerParams,
    "pages/1_Model_overview.py": P.OverviewParams,
    "pages/2_From_scratch.py": P.ScratchParams,
    "pages/3_Compare.py": P.CompareParams,
    "pages/4_Generation.py": P.GenerationParams,
    "pages/5_Head_atlas.py": P.AtlasParams,
    "pages/6_Explain.py": P.ExplainParams,
}


def every_params_class() -> list[type[P.Params]]:
    found, todo = [], [P.Params]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_page_has_its_parameters_listed_here():
    assert set(every_params_class()) == {P.Params, *PAGES.values()}


@pytest.mark.parametrize("cls", every_params_class(), ids=lambda c: c.__name__)
def test_the_default_link_parses_back_to_the_defaults(cls):
    """Caught: a default outside its own parser's range (the routes threshold's link cap below its
    default), a choice default missing from its options, floats written shorter than they read."""
    for view in (cls(), cls(model=TINY)):
        link = view.to_query()
        assert not link.left_out
        back, applied, problems = cls.from_query(link.params)
        assert not problems, problems
        assert back == view
        assert applied == set(cls.names())
        for f in dataclasses.fields(cls):  # each value parses alone, over another base
            assert f.metadata["parse"](link.params[f.name]) == getattr(view, f.name), f.name


@pytest.mark.parametrize("page", [p for p in PAGES if "atlas" not in p])
def test_each_page_writes_a_default_link_it_reads_back(env, page):
    """Open the page with only a model; the link it writes (its defaults, some resolved by the
    page: the stack, the token, a first real change) parses with the page's own parameters
    without a problem, and writes back the same link."""
    at = new_app(page, model=TINY).run()
    assert not at.exception, [e.value for e in at.exception]
    written = dict(at.query_params)
    cls = PAGES[page]
    back, _, problems = cls.from_query(written)
    assert not problems, problems
    assert back.model == TINY and set(written) == set(cls.names())
    assert back.to_query().params == written
