"""The training bar's ETA leaves out the first step's warm-up."""

from __future__ import annotations

import io

from cadence.observe.progress import TrainingBar


def _eta(bar: TrainingBar) -> str:
    return bar.format_dict and TrainingBar.format_meter(**bar.format_dict).split("<")[1].split(",")[0]


def test_eta_after_a_slow_first_step_is_the_steady_rate():
    clock = [0.0]
    bar = TrainingBar(total=100, file=io.StringIO(), mininterval=0, miniters=1, smoothing=0.3)
    bar._time = lambda: clock[0]  # a fake clock: the test reads no wall time
    bar.start_t = bar.last_print_t = 0.0
    clock[0] = 60.0  # the first step: a minute of warm-up
    bar.update()
    assert _eta(bar) == "?"  # nothing steady to go on yet
    for _ in range(4):  # then 1 s a step
        clock[0] += 1.0
        bar.update()
    assert _eta(bar) == "01:35"  # 95 steps left at 1 s each, not ~12 s each
    bar.close()


def test_a_plain_bar_would_have_counted_the_warm_up():
    """The failure this bar fixes: without the reset the same steps read many minutes."""
    from tqdm import tqdm

    clock = [0.0]
    bar = tqdm(total=100, file=io.StringIO(), mininterval=0, miniters=1, smoothing=0.3)
    bar._time = lambda: clock[0]
    bar.start_t = bar.last_print_t = 0.0
    clock[0] = 60.0
    bar.update()
    for _ in range(4):
        clock[0] += 1.0
        bar.update()
    assert _eta(bar) != "01:35"
    bar.close()
