"""The share link as plain text with a copy button (a `st.components.v2` element, no build step).

It was ``st.code(link, wrap_lines=True)``: Streamlit's code block syntax-highlights its text, and
a link that carries a compressed 1,500-token text cost 0.3–0.8 s of Chromium's CPU on every page
(docs/benchmarks.md, issue 40). Here the link is the text of one element (``textContent``: no
markup is read from it) that the browser wraps anywhere, and a button copies it.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

COMPONENT = "attnviz_share_link"
HTML = """<div class="share"><div class="link" data-testid="attnvizShareLink"></div>
<button type="button" class="copy" data-testid="attnvizShareCopy" title="Copy the link">Copy</button></div>"""
CSS = """
.share { display: flex; gap: .5rem; align-items: flex-start; }
.link { flex: 1; min-width: 0; max-height: 7.5em; overflow-y: auto; padding: .45rem .6rem;
  border-radius: .5rem; background: var(--st-secondary-background-color, #f0f2f6);
  color: var(--st-text-color, #31333f); font: .85rem/1.45 "Source Code Pro", monospace;
  overflow-wrap: anywhere; user-select: all; }
.copy { flex: none; padding: .35rem .75rem; border-radius: .5rem; cursor: pointer;
  border: 1px solid var(--st-border-color, #d5d6d9); background: var(--st-background-color, #fff);
  color: var(--st-text-color, #31333f); font: .85rem sans-serif; }
"""
JS = """
export default function(component) {
  const { data, parentElement } = component;
  const link = parentElement.querySelector('.link'), copy = parentElement.querySelector('.copy');
  link.textContent = data.url;  // text, never markup
  const said = (text) => { copy.textContent = text; setTimeout(() => { copy.textContent = 'Copy'; }, 1500); };
  const fallback = () => {  // no clipboard API outside a secure context (http on another host)
    const range = document.createRange();
    range.selectNodeContents(link);
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    said(document.execCommand('copy') ? 'Copied' : 'Press Ctrl+C');
  };
  copy.onclick = () => {
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(data.url).then(() => said('Copied'), fallback);
    } else {
      fallback();
    }
  };
}
"""

_component: Any = None


def _mount() -> Any:
    global _component
    if _component is None:  # registered once per process, on first use (never at import)
        _component = st.components.v2.component(COMPONENT, html=HTML, css=CSS, js=JS)
    return _component


def show(url: str) -> None:
    """The link ``url`` as wrapped plain text beside a Copy button."""
    _mount()(data={"url": url}, key="share_link", height="content")
