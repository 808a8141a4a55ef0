"""experiments/plots.py: what a table's plot shows is never cut at the figure's edges."""

from __future__ import annotations

from pathlib import Path

import pytest
from experiments import plots


def _inside(figure: object, artist: object) -> bool:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()  # type: ignore[arg-type]
    box = artist.get_window_extent(renderer=renderer)  # type: ignore[attr-defined]
    return bool(box.x0 >= -0.5 and box.x1 <= figure.bbox.width + 0.5)  # type: ignore[attr-defined]


@pytest.mark.parametrize("panels", [1, 3])
def test_a_legend_of_long_labels_fits_the_figure(tmp_path: Path, panels: int) -> None:
    """One narrow panel (an lr search) or a line of three, whose rows have long names: the legend under
    the panels is within the figure (fewer columns, else a wider figure), not cut at both sides."""
    figure, axes, first = plots.panel_grid(panels, 4.0, 3.0)
    names = ["PerFIT, ranks 8/12/16, pathological", "PerFIT s = 0.5, 2nd-order importance, pathological"]
    names += ["PerFIT s = 0.5, mixed importance, pathological"]
    for ax in axes:
        for i, name in enumerate(names):
            ax.plot([1e-3, 1e-2], [i, i + 1], label=name)
    path = plots.finish_grid(
        figure, axes, first, xlabel="lr", ylabel="ppl", title="t", path=tmp_path / "a.png"
    )
    assert path.read_bytes().startswith(b"\x89PNG")
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == names
    assert _inside(figure, legend)
