"""The attention-rhythm picture of one logged sample, for runs with
`algorithm.credit=local|global|coupled`: per response token its WAAD, FAI and the gamma
that scaled its advantage, computed on demand with the run's latest checkpoint (or
`model.path` before the first one) by the same `ActorAttention.token_credit` that
`cadence rhythm CKPT --from-rollout runs/X/samples.jsonl` plots. The trainer keeps no
per-token gammas, so the page asks for one sample at a time.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import yaml

from cadence.algo.rhythm import RhythmConfig

RHYTHM_CREDITS = ("local", "global", "coupled")


class RhythmReader:
    """One eager-attention copy of the newest checkpoint asked for, reused until a newer one appears."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one forward at a time: the dashboard shares the machine
        self._loaded: tuple[str, Any] | None = None  # (checkpoint and layers, ActorAttention)

    def sample(self, run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
        """WAAD, FAI, gamma per token: only tokens with loss (not observations) are ranked for credit."""
        import torch

        from cadence.train.checkpoint import latest_checkpoint

        cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
        algorithm = cfg.get("algorithm") or {}
        credit = algorithm.get("credit") or "none"
        if credit not in RHYTHM_CREDITS:
            raise ValueError(f"the run trains with algorithm.credit={credit}: no attention rhythm to show")
        rhythm = RhythmConfig(**(algorithm.get("rhythm") or {}))
        latest = latest_checkpoint(run_dir)
        checkpoint = str(latest[1]) if latest else str((cfg.get("model") or {}).get("path"))
        with self._lock:
            actor = self._actor(checkpoint, rhythm)
            mask = record["loss_mask"]
            gamma, info = actor.token_credit(torch.tensor(record["prompt_ids"]), torch.tensor(record["response_ids"]),
                                             credit, rhythm, loss_mask=torch.tensor(mask))
        gamma = [float(g) if m else 1.0 for g, m in zip(gamma.tolist(), mask, strict=True)]
        return {
            "checkpoint": Path(checkpoint).name if latest else checkpoint,
            "credit": credit,
            "tokens": record["tokens"],
            "loss_mask": mask,
            "waad": info["waad"].float().tolist(),
            "fai": info["fai"].float().tolist(),
            "gamma": gamma,
            "anchors": info["anchors"].bool().tolist(),
            "credited": [g != 1.0 for g in gamma],
        }

    def _actor(self, checkpoint: str, rhythm: RhythmConfig):
        from cadence.models.attention import ActorAttention
        from cadence.models.loading import load_policy
        from cadence.runtime.threads import configure_threads

        key = f"{checkpoint} {rhythm.layers}"
        if self._loaded is None or self._loaded[0] != key:
            configure_threads(1)
            self._loaded = None  # free the old copy before loading the next
            self._loaded = (key, ActorAttention(load_policy(checkpoint), layers=rhythm.layers))
        return self._loaded[1]
