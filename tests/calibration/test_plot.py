"""The predicted-vs-measured plot writer."""

from __future__ import annotations

from overlap_harness.reports.calibration_plot import points, write_plot


def _row(kind, measured, predicted):
    return {"run_id": "r", "kind": kind,
            "metrics": {k: {"measured": measured, "predicted": predicted}
                        for k in ("iteration_ns", "host_stall_ns", "forward_idle_ns")}}


def test_points_are_microseconds_with_the_kind():
    rows = [_row("racy", 2_000_000, 1_000_000), _row("race_free", 5000, 0)]
    assert points(rows, "iteration_ns") == [(2000.0, 1000.0, "racy"), (5.0, 0.0, "race_free")]


def test_write_plot_writes_a_png(tmp_path):
    rows = [_row("racy", 8_000_000, 7_500_000), _row("race_free", 90_000, 0),
            _row("race_free", 100_000_000, 110_000_000)]  # spans > 2 decades: log axes
    path = write_plot(rows, tmp_path / "p.png", "title")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000


def test_write_plot_with_no_rows(tmp_path):
    assert write_plot([], tmp_path / "empty.png", "nothing").stat().st_size > 1000
