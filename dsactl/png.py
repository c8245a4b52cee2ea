"""Chart files: a matplotlib figure written as a palette PNG.

The charts are lines, markers and bars in a few dozen colors; 256 palette entries hold them (antialiased
edges included) in about a third of the bytes of the RGBA file matplotlib writes, which keeps the
committed profiles/<gpu>/ folders small.
"""

from __future__ import annotations

import io
from pathlib import Path

DPI = 120
PALETTE_COLORS = 256


def save(fig, path: Path) -> Path:
    """Render `fig` at DPI and write it to `path` as an optimized 8-bit palette PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=PALETTE_COLORS, method=Image.Quantize.MEDIANCUT).save(
            path, format="PNG", optimize=True)
    return path
