// attnviz heatmaps: one element draws a set of heatmap panels once (server-made PNGs, one pixel
// per cell, scaled without smoothing), a colour bar, token labels where they fit, a hover with each
// cell's exact value (float32 shipped with the panel), clicks as events, the open panel framed, and
// (grids) a hovered panel shown enlarged. Text from the page is set with textContent, never HTML.
// Python side and data format: ui/heatmaps.py.
const REG = (window.__attnvizHeatmaps = window.__attnvizHeatmaps || {});
const LABEL_W = 92, LABEL_H = 54, GAP = 6, TITLE_H = 18, ROW_W = 56;

function el(tag, cls, parent, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}

function floats(b64) {
  const raw = atob(b64), bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return new Float32Array(bytes.buffer);
}

function tip() {
  let t = document.querySelector('body > .avh-tip');
  if (!t) {
    t = el('div', 'avh-tip', document.body);
    t.setAttribute('data-testid', 'attnvizHover');
    t.style.cssText = 'position:fixed;display:none;z-index:1001;pointer-events:none;background:#fff;'
      + 'border:1px solid #ccc;border-radius:4px;padding:4px 6px;font:12px sans-serif;color:#31333f;'
      + 'white-space:pre;box-shadow:0 2px 6px rgba(0,0,0,.2);max-width:360px;overflow:hidden';
  }
  return t;
}

function previewBox() {
  let box = document.querySelector('body > .avh-preview');
  if (!box) {
    box = el('div', 'avh-preview', document.body);
    box.setAttribute('data-testid', 'attnvizHeadPreview');
    box.style.cssText = 'position:fixed;display:none;z-index:1000;pointer-events:none;background:#fff;'
      + 'border:1px solid #ccc;border-radius:4px;padding:6px;box-shadow:0 2px 8px rgba(0,0,0,.25);'
      + 'font:12px sans-serif;color:#31333f';
    el('div', '', box);
    el('img', '', box).style.cssText = 'display:block;image-rendering:pixelated';
  }
  return box;
}

function fmt(v) { return Math.abs(v) >= 1000 || (v !== 0 && Math.abs(v) < 0.001) ? v.toExponential(2) : String(+v.toPrecision(3)); }

function build(root, data) {
  root.replaceChildren();
  const P = data.panels, n = P.length, cols = Math.max(1, data.cols);
  const rows = Math.ceil(n / cols);
  const axes = !!data.axes, width = root.clientWidth || root.parentElement.clientWidth || 600;
  const bins = Math.max(...P.map(p => Math.max(p.rows, p.cols)));
  const fit = room => Math.max(16, Math.min(data.tile, Math.floor(room / cols - GAP)));
  // token labels only where each has 12 px of its row (`attnviz.figures.labels_fit`) at the drawn size
  // and where they leave the picture 160 px at least (a narrow window: the picture, the hover's labels)
  const labelsOn = !!data.labels && fit(width - LABEL_W) / bins >= 12 && fit(width - LABEL_W) >= 160;
  // `col_titles` / `row_titles` (a mosaic): one title per column above the first row and one per
  // row left of the first column, instead of a title over every panel
  const colT = data.col_titles, rowT = data.row_titles, rowW = rowT ? ROW_W : 0;
  const left = (labelsOn ? LABEL_W : 0) + rowW, below = labelsOn ? LABEL_H : 0;
  const tile = fit(width - left);
  const head = el('div', 'avh-head', root);
  const hoist = !data.title && n === 1;  // one panel: its title is the element's
  el('div', 'avh-title', head, hoist ? P[0].title : data.title);
  const save = el('button', 'avh-save', head, '⬇ PNG');
  save.title = 'Save this view as ' + data.name + '.png (2x)';
  const grid = el('div', 'avh-grid', root);
  grid.style.gridTemplateColumns = `repeat(${cols}, ${tile}px)`;
  grid.style.marginLeft = left + 'px';
  const boxes = [];
  P.forEach((p, i) => {
    const cell = el('div', 'avh-cell', grid);
    if (!hoist && !colT) el('div', 'avh-ptitle', cell, p.title);
    else if (colT && i < cols) el('div', 'avh-ptitle', cell, colT[i]);
    const big = Math.max(p.rows, p.cols, 1);
    const w = Math.max(1, Math.round(tile * p.cols / big)), h = Math.max(1, Math.round(tile * p.rows / big));
    const wrap = el('div', 'avh-wrap', cell);
    wrap.style.width = w + 'px';
    wrap.style.height = h + 'px';
    const img = el('img', 'avh-img', wrap);
    img.src = 'data:image/png;base64,' + p.png;
    img.alt = p.title;
    img.draggable = false;
    img.dataset.panel = String(i);
    const q = p.q || data.q, k = p.k || data.k;
    const r = Math.floor(i / cols), c = i % cols;
    if (rowT && c === 0) {
      const t = el('div', 'avh-rowtitle', wrap, rowT[r]);
      t.style.right = `calc(100% + ${labelsOn ? LABEL_W : 0}px)`;
      t.style.width = (ROW_W - 4) + 'px';
    }
    if (labelsOn && c === 0) {
      const ys = el('div', 'avh-ylabels', wrap);
      q.forEach((t, j) => { const s = el('div', '', ys, t); s.style.top = ((j + 0.5) * h / p.rows) + 'px'; });
    }
    if (labelsOn && i + cols >= n) {
      const xs = el('div', 'avh-xlabels', wrap);
      k.forEach((t, j) => { const s = el('div', '', xs, t); s.style.left = ((j + 0.5) * w / p.cols) + 'px'; });
    }
    if (labelsOn && i + cols >= n) wrap.style.marginBottom = below + 'px';
    boxes.push({wrap, img, p, q, k, values: null, w, h, r, c});
  });
  const bar = el('div', 'avh-bar', root);
  bar.style.marginLeft = left + 'px';
  if (data.colorbar === false) bar.style.display = 'none';
  const bw = Math.min(300, Math.max(80, cols * (tile + GAP) - 90));
  el('div', 'avh-bartitle', bar, data.bar.title);
  const strip = el('div', 'avh-strip', bar);
  strip.style.width = bw + 'px';
  const ramp = el('img', 'avh-ramp', strip);
  ramp.src = 'data:image/png;base64,' + data.bar.png;
  const ticks = data.bar.ticks.length ? data.bar.ticks : [[data.bar.cmin, fmt(data.bar.cmin)], [data.bar.cmax, fmt(data.bar.cmax)]];
  const span = (data.bar.cmax - data.bar.cmin) || 1;
  ticks.forEach(([v, t]) => {
    const s = el('div', 'avh-tick', strip, t);
    s.style.left = (bw * (v - data.bar.cmin) / span) + 'px';
  });
  if (axes) el('div', 'avh-xaxis', bar, 'rows: query · columns: key');

  let mark = null;
  function setOpen(i) {
    if (mark) mark.remove();
    mark = null;
    const b = boxes[i];
    if (i === null || i === undefined || !b) return;
    mark = el('div', 'avh-mark', b.wrap);
    mark.setAttribute('data-testid', 'attnvizOpenHead');
    mark.dataset.head = String(i);
  }
  setOpen(data.open);

  function cellAt(b, ev) {
    const rc = b.img.getBoundingClientRect();
    const col = Math.floor((ev.clientX - rc.left) / rc.width * b.p.cols);
    const row = Math.floor((ev.clientY - rc.top) / rc.height * b.p.rows);
    if (col < 0 || row < 0 || col >= b.p.cols || row >= b.p.rows) return null;
    return [row, col];
  }
  const t = tip();
  boxes.forEach((b, i) => {
    b.img.addEventListener('mousemove', ev => {
      const at = cellAt(b, ev);
      if (!at) { t.style.display = 'none'; return; }
      if (!b.values) b.values = floats(b.p.values);
      const [row, col] = at, v = b.values[row * b.p.cols + col];
      t.textContent = `${b.p.title}\nquery ${b.q[row]}\nkey ${b.k[col]}\n${data.bar.hover} ${v.toFixed(data.bar.digits)}`;
      t.dataset.panel = String(i);
      t.dataset.row = String(row);
      t.dataset.col = String(col);
      t.style.left = Math.min(window.innerWidth - 260, ev.clientX + 14) + 'px';
      t.style.top = Math.min(window.innerHeight - 90, ev.clientY + 14) + 'px';
      t.style.display = 'block';
    });
    b.img.addEventListener('mouseleave', () => { t.style.display = 'none'; });
    if (data.preview) {
      b.img.addEventListener('mouseenter', () => {
        const box = previewBox(), [title, img] = box.children;
        const side = Math.min(window.innerHeight - 60, Math.max(data.preview_px || 300, 2 * b.w));
        title.textContent = b.p.title + ' (enlarged; the hover gives each value)';
        img.src = b.img.src;
        img.style.width = side + 'px';
        img.style.height = Math.round(side * b.h / b.w) + 'px';
        const g = root.getBoundingClientRect(), rc = b.img.getBoundingClientRect();
        const room = window.innerWidth - g.right;
        // beside the element when there is room (the Explorer's grid), else beside the tile on
        // its roomier side (a full-width mosaic): never over the tile under the pointer
        const beside = rc.right + side + 32 < window.innerWidth ? rc.right + 12 : rc.left - side - 24;
        box.style.left = (room > side + 24 ? g.right + 8 : Math.max(8, beside)) + 'px';
        box.style.top = Math.max(8, Math.min(window.innerHeight - side - 40, rc.top + rc.height / 2 - side / 2)) + 'px';
        box.style.display = 'block';
      });
      b.img.addEventListener('mouseleave', () => { previewBox().style.display = 'none'; });
    }
    if (data.click) {
      b.img.style.cursor = 'pointer';
      b.img.addEventListener('click', ev => {
        const at = cellAt(b, ev) || [0, 0];
        const value = data.click === 'cell' ? {panel: i, row: at[0], col: at[1]} : {panel: i};
        value.n = Date.now();
        root.__avhSend('click', value);
      });
    }
  });
  save.addEventListener('click', () => savePng(root, data, boxes, tile));
  return setOpen;
}

function savePng(root, data, boxes, tile) {
  const scale = 2, g = root.getBoundingClientRect();
  const cv = document.createElement('canvas');
  cv.width = Math.ceil(g.width * scale);
  cv.height = Math.ceil(g.height * scale);
  const ctx = cv.getContext('2d');
  ctx.scale(scale, scale);
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, g.width, g.height);
  ctx.imageSmoothingEnabled = false;
  ctx.fillStyle = '#31333f';
  const put = (node, font, align) => {
    const r = node.getBoundingClientRect();
    ctx.font = font;
    ctx.textAlign = align || 'left';
    ctx.fillText(node.textContent, (align === 'right' ? r.right : r.left) - g.left, r.top - g.top + r.height * 0.75);
  };
  put(root.querySelector('.avh-title'), 'bold 14px sans-serif');
  root.querySelectorAll('.avh-ptitle').forEach(n => put(n, '11px sans-serif'));
  root.querySelectorAll('.avh-ylabels div').forEach(n => put(n, '9px sans-serif', 'right'));
  root.querySelectorAll('.avh-rowtitle').forEach(n => put(n, '11px sans-serif', 'right'));
  root.querySelectorAll('.avh-xlabels div').forEach(n => {
    const r = n.getBoundingClientRect();
    ctx.save();
    ctx.translate(r.left - g.left + r.width / 2 + 3, r.top - g.top);
    ctx.rotate(-Math.PI / 2);
    ctx.font = '9px sans-serif';
    ctx.textAlign = 'right';
    ctx.fillText(n.textContent, 0, 0);
    ctx.restore();
  });
  root.querySelectorAll('.avh-img, .avh-ramp').forEach(img => {
    const r = img.getBoundingClientRect();
    ctx.drawImage(img, r.left - g.left, r.top - g.top, r.width, r.height);
  });
  root.querySelectorAll('.avh-bartitle, .avh-tick').forEach(n => put(n, '10px sans-serif'));
  const a = document.createElement('a');
  a.href = cv.toDataURL('image/png');
  a.download = data.name + '.png';
  a.click();
}

export default function(component) {
  const { data, parentElement, setTriggerValue } = component;
  if (!data) return;
  if (data.mark !== undefined) {  // `mark`: frame panel `index` of the element `mark` (drawn earlier)
    let tries = 0, timer = null;
    const go = () => {
      const target = REG[data.mark];
      if (target) { target.setOpen(data.index); return; }
      if (tries++ < 100) timer = setTimeout(go, 100);
    };
    go();
    return () => { if (timer) clearTimeout(timer); };
  }
  let root = parentElement.querySelector(':scope > .avh-root');
  if (!root) {
    root = el('div', 'avh-root', parentElement);
    root.setAttribute('data-testid', 'attnvizHeatmaps');
  }
  root.__avhSend = setTriggerValue;
  root.dataset.key = data.id;
  if (root.__avhRev !== data.rev) {  // drawn once per content: a rerun with the same data keeps it
    root.__avhRev = data.rev;
    root.__avhData = data;  // what it draws, for a test or a console to read back
    root.__avhSetOpen = build(root, data);
  } else {
    root.__avhSetOpen(data.open);
  }
  REG[data.id] = { setOpen: i => root.__avhSetOpen(i) };
}
