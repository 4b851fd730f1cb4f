"""The layer grid's browser side (a `st.components.v2` component, no build step): the open head
framed in the grid, and a hover on a tile showing that head enlarged beside the grid.

Mounted in the big head's fragment with the open head: a head change reruns only that fragment,
so the grid (drawn once by the layer's fragment) is not sent again, and this component moves the
frame. The preview is the tile's own picture (the image Plotly drew for that heatmap), scaled up
without smoothing: it shows what the tile shows, larger; the grid's hover gives the exact value.
The component draws nothing of its own; it finds the grid by its tiles' click targets (traces
named "tile …", `attnviz.figures.grid`).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

OPEN_MARK = "#ff2b2b"  # the app's accent red, as `attnviz.figures.grid.OPEN_MARK`
PREVIEW_PX = 300  # the enlarged head's side at least (else twice the tile, within the window)

JS = """
const MARK = 'attnviz-open-head', PREVIEW = 'attnviz-head-preview';

function gridPlot() {
  return Array.from(document.querySelectorAll('.js-plotly-plot')).find(
    gd => (gd._fullData || []).some(t => (t.name || '').startsWith('tile ')));
}

function axisOf(gd, id) {  // 'x3' -> layout.xaxis3
  return gd._fullLayout[id.charAt(0) + 'axis' + id.slice(1)];
}

function heatmaps(gd) { return gd._fullData.filter(t => t.type === 'heatmap'); }

function tileBox(gd, trace) {  // the tile's box in the chart's pixels
  const xa = axisOf(gd, trace.xaxis), ya = axisOf(gd, trace.yaxis);
  return {left: xa._offset, top: ya._offset, width: xa._length, height: ya._length};
}

function placeMark(gd, index, colour) {
  const host = gd.parentElement;
  let mark = host.querySelector(':scope > .' + MARK);
  const trace = heatmaps(gd)[index];
  if (!trace) { if (mark) mark.remove(); return; }
  if (!mark) {
    mark = document.createElement('div');
    mark.className = MARK;
    mark.setAttribute('data-testid', 'attnvizOpenHead');
    mark.style.cssText = 'position:absolute;pointer-events:none;z-index:3;box-sizing:border-box;'
      + 'border:3px solid ' + colour + ';border-radius:2px';
    if (getComputedStyle(host).position === 'static') host.style.position = 'relative';
    host.appendChild(mark);
  }
  const b = tileBox(gd, trace), g = gd.getBoundingClientRect(), h = host.getBoundingClientRect();
  mark.style.left = (g.left - h.left + b.left - 4) + 'px';
  mark.style.top = (g.top - h.top + b.top - 4) + 'px';
  mark.style.width = (b.width + 8) + 'px';
  mark.style.height = (b.height + 8) + 'px';
  mark.dataset.head = String(index);
}

function preview(side) {
  let box = document.querySelector('.' + PREVIEW);
  if (!box) {
    box = document.createElement('div');
    box.className = PREVIEW;
    box.setAttribute('data-testid', 'attnvizHeadPreview');
    box.style.cssText = 'position:fixed;display:none;z-index:1000;pointer-events:none;background:#fff;'
      + 'border:1px solid #ccc;border-radius:4px;padding:6px;box-shadow:0 2px 8px rgba(0,0,0,.25);'
      + 'font:12px sans-serif;color:#31333f';
    const title = document.createElement('div');
    const img = document.createElement('img');
    img.style.cssText = 'display:block;image-rendering:pixelated;width:' + side + 'px;height:' + side + 'px';
    box.append(title, img);
    document.body.appendChild(box);
  }
  return box;
}

function hookHover(gd, side) {
  if (gd.__attnvizHover) return;
  gd.__attnvizHover = true;
  gd.on('plotly_hover', ev => {
    const p = ev.points && ev.points[0];
    if (!p) return;
    const trace = heatmaps(gd).find(t => t.xaxis === p.data.xaxis && t.yaxis === p.data.yaxis);
    const sub = trace && gd.querySelector('g.subplot.' + trace.xaxis + trace.yaxis + ' g.heatmaplayer image');
    if (!sub) return;
    const box = preview(side), [title, img] = box.children;
    // at least twice the tile, within the window
    const big = Math.min(window.innerHeight - 60, Math.max(side, 2 * tileBox(gd, trace).width));
    img.style.width = img.style.height = big + 'px';
    title.textContent = trace.name + ' (enlarged; the hover gives each value)';
    img.src = sub.getAttribute('href') || sub.getAttribute('xlink:href');
    const g = gd.getBoundingClientRect(), e = ev.event || {clientY: g.top};
    const room = window.innerWidth - g.right;
    box.style.left = (room > big + 24 ? g.right + 8 : Math.max(8, g.left - big - 24)) + 'px';
    const top = (e.clientY || g.top) - big / 2;
    box.style.top = Math.max(8, Math.min(window.innerHeight - big - 40, top)) + 'px';
    box.style.display = 'block';
  });
  gd.on('plotly_unhover', () => { preview(side).style.display = 'none'; });
}

export default function(component) {
  const { data } = component;
  let tries = 0, timer = null;
  const attach = () => {
    const gd = gridPlot();
    if (!gd || !gd._fullLayout || !gd.on) {
      if (tries++ < 100) timer = setTimeout(attach, 100);
      return;
    }
    placeMark(gd, data.index, data.colour);
    hookHover(gd, data.preview_px);
    if (!gd.__attnvizReplot) {  // a relayout / resize / new layer moves the tiles
      gd.__attnvizReplot = true;
      gd.on('plotly_afterplot', () => placeMark(gd, window.__attnvizOpenIndex, data.colour));
    }
  };
  window.__attnvizOpenIndex = data.index;
  attach();
  return () => { if (timer) clearTimeout(timer); };
}
"""

_component: Any = None


def _mount() -> Any:
    global _component
    if _component is None:  # registered once per process, on first use (never at import)
        _component = st.components.v2.component("attnviz_grid_hover", js=JS)
    return _component


def mark(index: int) -> None:
    """Frame the tile at ``index`` (the open head's place in the grid) and enlarge a hovered tile."""
    _mount()(
        data={"index": int(index), "colour": OPEN_MARK, "preview_px": PREVIEW_PX},
        key="grid_hover",
        height="content",
    )
