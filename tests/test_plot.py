"""Tuning curves as PNG files: what a reader sees in them."""
import matplotlib.figure

from search_space import conv2d
from tuner.plot import plot_job, plot_tuners


def test_a_convolutions_key_stays_inside_the_figure(tmp_path, monkeypatch):
    """A convolution's workload key is 104 characters without a space: the title breaks after its commas, every
    line inside the figure as it is saved, and reads as the key but for spaces."""
    titles = []
    save = matplotlib.figure.Figure.savefig

    def saved(figure, *args, **kwargs):
        save(figure, *args, **kwargs)
        text = figure.axes[0].title
        titles.append((text.get_text(), text.get_window_extent(figure.canvas.get_renderer()), figure.bbox.width))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", saved)
    key = conv2d(1, 512, 7, 7, 512, 3, 3, stride=1, pad=1, bias=True, epilogue="relu", layout="nhwc").key
    plot_tuners({"xgb": [[100.0, 200.0, 300.0]]}, f"{key} (replay, 9 seeds)", tmp_path / "tuners.png", 300.0)
    plot_job([100.0, 50.0, 300.0], [False, True, False], [100.0, 100.0, 300.0], key, tmp_path / "job.png")
    assert len(titles) == 2 and all((tmp_path / name).stat().st_size for name in ("tuners.png", "job.png"))
    for (text, box, width), title in zip(titles, (f"{key} (replay, 9 seeds)", key)):
        assert 0 <= box.x0 and box.x1 <= width and "\n" in text
        assert "".join(text.split()) == "".join(title.split())
