"""The training progress bar, with an ETA that the first step's warm-up does not inflate.

A run's first step carries one-time costs (the engine's first batch, allocator and
kernel warm-up, cold caches; on a loaded machine, seconds more), so tqdm's rate, taken
from it, made a one-minute job read "22-31 minutes" left. `TrainingBar` starts its
clock again after the first step: the ETA shows "?" until a second step is timed,
then the steady rate. Elapsed time on the bar counts from the end of that first step.
"""

from __future__ import annotations

from typing import Any

from tqdm import tqdm
from tqdm.std import EMA


class TrainingBar(tqdm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.warming = True  # until the first step has been shown

    def update(self, n: float = 1) -> bool | None:
        shown = super().update(n)
        if self.warming and shown:
            self.warming = False
            # Forget the warm-up: the rate (EMA, or the average since start_t) starts from here.
            self._ema_dn, self._ema_dt = EMA(self.smoothing), EMA(self.smoothing)
            self.start_t, self.initial = self.last_print_t, self.n
            self.refresh()
        return shown
