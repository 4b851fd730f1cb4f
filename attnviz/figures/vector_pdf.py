"""PDF of a figure, from the same scene as its SVG (`attnviz.figures.vector`): one page,
1 px = 1 pt, heatmaps as images (one pixel per cell, no interpolation), text in Helvetica
(selectable; a character outside Windows-1252 is written as "?")."""

from __future__ import annotations

import zlib

import numpy as np
import plotly.graph_objects as go

from attnviz.figures.vector import DEFAULT_WIDTH, INK, rgb_of, scene_of


def _pdf_text(text: str) -> str:
    raw = text.encode("cp1252", errors="replace").decode("latin-1")
    return raw.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def to_pdf(fig: go.Figure, width: int = DEFAULT_WIDTH) -> bytes:
    """``fig`` as a one-page PDF (1 px = 1 pt): heatmaps as images, text in Helvetica (selectable)."""
    s = scene_of(fig, width)
    H = s.height
    ops, objects, names = ["1 1 1 rg", f"0 0 {s.width:.2f} {H:.2f} re f"], [], []
    for i, (x, y, w, h, img) in enumerate(s.images):
        rows, cols = img.shape[:2]
        objects.append(
            (
                f"<< /Type /XObject /Subtype /Image /Width {cols} /Height {rows} /ColorSpace /DeviceRGB "
                f"/BitsPerComponent 8 /Filter /FlateDecode /Interpolate false /Length {{n}} >>"
            ),
        )
        names.append(zlib.compress(np.ascontiguousarray(img).tobytes()))
        ops.append(f"q {w:.2f} 0 0 {h:.2f} {x:.2f} {H - y - h:.2f} cm /Im{i} Do Q")
    for pts, colour, lw in s.lines:
        r, g, b = (c / 255 for c in rgb_of(colour))
        path = " ".join(f"{x:.1f} {H - y:.1f} {'m' if j == 0 else 'l'}" for j, (x, y) in enumerate(pts))
        ops.append(f"{r:.3f} {g:.3f} {b:.3f} RG {lw:g} w {path} S")
    for cx, cy, rad, colour in s.dots:
        r, g, b = (c / 255 for c in rgb_of(colour))
        ops.append(
            f"{r:.3f} {g:.3f} {b:.3f} rg {cx - rad:.1f} {H - cy - rad:.1f} {2 * rad:.1f} {2 * rad:.1f} re f"
        )
    for x, y, w, h, colour, lw in s.rects:
        r, g, b = (c / 255 for c in rgb_of(colour))
        ops.append(f"{r:.3f} {g:.3f} {b:.3f} RG {lw:g} w {x:.1f} {H - y - h:.1f} {w:.1f} {h:.1f} re S")
    ink = " ".join(f"{c / 255:.3f}" for c in rgb_of(INK))
    for x, y, text, size, anchor, angle in s.texts:
        shift = (
            {"start": 0.0, "middle": 0.5, "end": 1.0}[anchor] * 0.5 * size * len(text)
        )  # Helvetica ~0.5 em
        a = np.deg2rad(-angle)
        ca, sa = np.cos(a), np.sin(a)
        tx, ty = x - shift * ca, H - y - shift * sa
        matrix = f"{ca:.4f} {sa:.4f} {-sa:.4f} {ca:.4f} {tx:.2f} {ty:.2f}"
        ops.append(f"BT {ink} rg /F1 {size:g} Tf {matrix} Tm ({_pdf_text(text)}) Tj ET")
    content = zlib.compress("\n".join(ops).encode("latin-1"))
    images = " ".join(f"/Im{i} {5 + i} 0 R" for i in range(len(names)))
    body = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        (f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {s.width:.2f} {H:.2f}] /Contents 4 0 R "
         f"/Resources << /Font << /F1 {5 + len(names)} 0 R >> /XObject << {images} >> >> >>").encode(),
        f"<< /Filter /FlateDecode /Length {len(content)} >>\nstream\n".encode() + content + b"\nendstream",
        *[d.replace("{n}", str(len(data))).encode() + b"\nstream\n" + data + b"\nendstream"
          for d, data in zip(objects, names, strict=True)],
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]  # fmt: skip
    out, offsets = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n"), []
    for i, obj in enumerate(body, start=1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + obj + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(body) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(body) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)
