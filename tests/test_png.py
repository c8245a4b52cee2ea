"""dsactl.png: charts are written as palette PNGs of the figure's size, smaller than matplotlib's own."""

import io

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from dsactl import png  # noqa: E402


def test_a_chart_is_a_palette_png_of_the_figure_size_and_smaller_than_rgba(tmp_path):
    fig, ax = plt.subplots(figsize=(4, 3))
    xs = [i / 10 for i in range(100)]
    for k in range(1, 6):
        ax.plot(xs, [x ** k / 10 ** (k - 1) for x in xs], label=f"x^{k}")
    ax.legend()
    rgba = io.BytesIO()
    fig.savefig(rgba, format="png", dpi=png.DPI)
    path = png.save(fig, tmp_path / "chart.png")
    plt.close(fig)
    with Image.open(path) as image:
        assert image.format == "PNG" and image.mode == "P"
        assert image.size == (4 * png.DPI, 3 * png.DPI)
        assert len(image.getcolors(maxcolors=png.PALETTE_COLORS)) > 5  # the lines' colors survive
    assert path.stat().st_size < len(rgba.getvalue()) / 2
