"""attnviz: the entry script. It builds the navigation and runs the page the URL names.

Every page is a file in pages/ with one parameters dataclass (ui/params.py); ui/shell.py holds
the table the navigation is built from. `streamlit run app.py` starts the app.
"""

import os

# torch's OpenMP workers sleep when an operation ends instead of spinning for the next one (libgomp
# reads this once, when torch is imported: so before anything imports it). The browser draws on
# the same cores as the server: spinning workers took its CPU and each other's, a layer change at
# 1,500 tokens went 0.8-1.1 s -> 0.6-0.75 s, the server's CPU for it 0.4-0.66 s -> 0.25 s; one
# forward is as fast (docs/benchmarks.md). A value set by whoever starts the server is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import sys

import streamlit as st

st.set_page_config(page_title="attnviz", page_icon=":material/search:", layout="wide")
# The page shell at once: on a fresh server the imports below (PyTorch, transformers) take
# seconds, and the first visitor saw a blank page until they were done.
_starting = st.empty()
if "ui.shell" not in sys.modules:
    _starting.info(
        "Starting attnviz: loading PyTorch and transformers (once per server start)…",
        icon=":material/hourglass_top:",
    )

from attnviz.server import env  # noqa: E402 - after the shell: the heavy imports
from ui import demo, shell  # noqa: E402

_starting.empty()
try:
    env.check_all()  # a bad ATTNVIZ_* flag stops every page with its name, not later in a page
except env.BadSetting as err:
    st.error(f"The server is misconfigured: {err}.", icon=":material/settings:")
    st.stop()
demo.refuse_shared_messages()  # demo: no client message reaches other visitors (ui/demo.py)
demo.limits_banner()
demo.link_too_long_notice()  # Streamlit drops a link over 512 Ki characters / 1,000 parameters
page = st.navigation(
    [
        st.Page(e.file, title=e.params.PAGE, icon=e.icon, url_path=e.url_path or None, default=not e.url_path)
        for e in shell.PAGES
    ],
    position="hidden",  # the sidebar draws the page links (ui/shell.py), above the model picker
)
page.run()
