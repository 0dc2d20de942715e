"""Saving figures: the layout runs once and every file is rendered from it."""

import matplotlib.pyplot as plt
import numpy as np

from fnsysid.plotting import save


def _figure():
    fig, axes = plt.subplots(1, 2, figsize=(6, 3), layout="constrained")
    r = np.arange(50)
    for ax in axes:
        ax.plot(r, 0.9 ** r + 1e-3, label="a long legend entry")
        ax.set_yscale("log")
        ax.set_title("a title\nof two lines", fontsize=9)
        ax.set_xlabel("communication round $r$")
    fig.suptitle("a figure title")
    return fig


def test_save_writes_the_png_savefig_writes_and_a_pdf_without_creation_date(tmp_path):
    ref = _figure()
    ref.savefig(tmp_path / "ref.png", dpi=110)
    plt.close(ref)
    fig = _figure()
    save(fig, [tmp_path / "fig.png", tmp_path / "fig.pdf"], dpi=110)
    assert (tmp_path / "fig.png").read_bytes() == (tmp_path / "ref.png").read_bytes()
    pdf = (tmp_path / "fig.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and b"CreationDate" not in pdf
    assert not plt.fignum_exists(fig.number)           # closed


def test_save_lays_the_figure_out_once(tmp_path, monkeypatch):
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    calls = []
    run = ConstrainedLayoutEngine.execute
    monkeypatch.setattr(ConstrainedLayoutEngine, "execute",
                        lambda self, fig: calls.append(fig) or run(self, fig))
    save(_figure(), [tmp_path / "a.png", tmp_path / "a.pdf"], dpi=110)
    assert len(calls) == 1
    ref = _figure()
    ref.savefig(tmp_path / "b.png", dpi=110)
    plt.close(ref)
    assert len(calls) == 2                              # savefig lays out for each file
