"""The rollout worker of an agentic run (a config with an `env` section).

Same interface as `RolloutWorker` (the trainer and `WorkerGroup` cannot tell
them apart), with episodes instead of prompts: an `EnvRollout` on the worker's
`InferenceHub`, all in one event loop in the worker's thread. The loop always
runs in its own thread, synchronous runs (alpha = 0) included: an episode
waiting on its environment needs the loop to keep turning, and with alpha = 0
the trainer and the loop simply take turns.

Admission is RLVR's rule: after s weight pushes at most (s + alpha + 1) x
quota groups have been started (plus one per group dropped for running out
of retries). Held-out evaluation plays `eval.episodes`
episodes on seeds training never uses (training seeds count up from
`1000 * (cfg.seed + 1)`, held-out ones from 10**9).
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback

import torch

from cadence.config import RunConfig
from cadence.envs.runner import EnvRunner
from cadence.inference.config import build_engine
from cadence.inference.hub import InferenceHub
from cadence.inference.prefix_reuse import reuse_metrics
from cadence.inference.types import SamplingParams
from cadence.models.loading import load_policy, load_tokenizer
from cadence.observe.events import Timeline
from cadence.rollout.buffer import SampleBuffer
from cadence.rollout.env_rollout import EnvRollout
from cadence.rollout.episode import run_episode
from cadence.rollout.evaluate import EvalResult, pass_at_k
from cadence.rollout.lockstep import LockstepRollout
from cadence.rollout.sample import Group
from cadence.rollout.turns import turn_format
from cadence.rollout.worker import worker_quotas
from cadence.runtime.threads import configure_threads

HELD_OUT_SEED = 10**9


class EpisodeWorker:
    def __init__(
        self, cfg: RunConfig, index: int = 0, workers: int = 1, threads: int = 0, background: bool = True
    ) -> None:
        assert cfg.env is not None, "EpisodeWorker needs a config with an env section"
        self.threads = configure_threads(threads)
        self.background = True  # always: episodes waiting on environments need the loop turning
        self.cfg = cfg
        self.index = index
        ro = cfg.rollout
        self.quota = worker_quotas(ro.prompts_per_step, workers)[index]
        self.alpha = ro.async_ratio
        self.tokenizer = load_tokenizer(cfg.model.path)
        self.turns = turn_format(cfg.env, self.tokenizer)  # chat template or plain text; before the weights load
        policy = load_policy(cfg.model.path).eval()
        # An episode never grows past the positions the model was built for (a tiny shipped model
        # knows 1024): the budget is the smaller of the config's and the model's.
        self.context_budget = min(ro.max_context_tokens, getattr(policy.config, "max_position_embeddings", None)
                                  or ro.max_context_tokens)
        self.engine = build_engine(ro.engine, policy, self.tokenizer)
        self.hub = InferenceHub([self.engine])
        stop = list(ro.stop or [])
        self.params = SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p, stop=stop)
        self.eval_params = SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=cfg.eval.temperature, stop=stop)
        self.buffer = SampleBuffer(self.alpha)
        self.extra_groups = ro.extra_groups
        lockstep = {"batch_groups": self.quota} if ro.env_mode == "lockstep" else {}
        self.rollout = (LockstepRollout if lockstep else EnvRollout)(
            self.hub, self._runner, self.tokenizer, self.params, self.buffer, ro.group_size,
            redundancy=ro.redundancy, max_context_tokens=self.context_budget, turns=self.turns,
            first_seed=1000 * (cfg.seed + 1) + 10**6 * index, **lockstep,
        )
        self.version = 0
        self.swaps = 0
        self.started_groups = 0
        self.handed_out = 0
        self._slot_lock = threading.Lock()
        self._new_weights: tuple[dict[str, torch.Tensor], int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._born = time.perf_counter()
        # The pipeline view of `cadence dashboard`: spans of generating / waiting / weight_sync.
        self.timeline = Timeline(cfg.run_dir() if cfg.logging.events else None, f"rollout-{self.index}")

    def _runner(self) -> EnvRunner:
        return EnvRunner.from_config(self.cfg.env)

    # -- the producer loop (the worker's thread) -----------------------------------
    def start(self) -> None:
        if self._thread is None:
            ready = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(ready,), name=f"episodes-{self.index}", daemon=True)
            self._thread.start()
            ready.wait()

    def _run(self, ready: threading.Event) -> None:
        configure_threads(self.threads)
        try:
            asyncio.run(self._main(ready))
        except Exception:  # surfaced to the trainer on its next call
            self._error = traceback.format_exc()
            ready.set()

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake, self._stopping = asyncio.Event(), asyncio.Event()
        server = asyncio.create_task(self.hub.serve(self._stopping))
        ready.set()
        try:
            while not self._stopping.is_set():
                self._swap_weights()
                room = self._allowed_groups() - self.started_groups
                if room > 0:
                    self.rollout.admit(room)
                    self.started_groups += room
                self.timeline.enter("generating" if self.rollout.in_flight() else "waiting")
                self._wake.clear()
                self.rollout.groups_done.clear()
                woken = [asyncio.ensure_future(e.wait()) for e in (self._wake, self.rollout.groups_done)]
                await asyncio.wait(woken, return_when=asyncio.FIRST_COMPLETED)
                for waiter in woken:
                    waiter.cancel()
        finally:
            await self.rollout.close()
            self._stopping.set()
            await server

    def _allowed_groups(self) -> int:
        # Groups dropped (out of retries) or cancelled as stale will never train: replace them.
        never_trained = self.rollout.counts["groups_dropped"] + self.rollout.counts["groups_stale"]
        return (self.swaps + self.alpha + 1) * self.quota + self.extra_groups + never_trained

    def _swap_weights(self) -> None:
        """Hand queued weights to the hub (swapped in between two engine rounds). Episodes in
        flight go on under them, each turn tagged with the version that generated it."""
        with self._slot_lock:
            new, self._new_weights = self._new_weights, None
        if new is None:
            return
        state_dict, version = new
        self.timeline.enter("weight_sync")
        self.hub.update_weights(state_dict, version)
        if self._thread is None:
            self.hub.apply_weights()
        self.version = self.rollout.version = version
        self.swaps += 1
        if self.extra_groups:  # extra groups still open this late could only be dropped as stale
            self.rollout.cancel_stale(version - self.alpha)

    def _poke(self) -> None:
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def _check(self) -> None:
        if self._error:
            raise RuntimeError(f"episode worker {self.index} failed:\n{self._error}")

    # -- what the trainer calls ------------------------------------------------------
    def get_batch(self, trainer_version: int, timeout: float = 600.0) -> list[Group]:
        self.start()
        deadline = time.perf_counter() + timeout
        while True:
            self._check()
            try:
                batch = self.buffer.get_batch(self.quota, trainer_version, timeout=0.05)
            except TimeoutError:
                if time.perf_counter() > deadline:
                    raise
                continue
            self.handed_out += len(batch)
            self._poke()  # a dropped group frees room; the loop re-checks admission
            return batch

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        with self._slot_lock:
            self._new_weights = (state_dict, version)
        if self._thread is None:
            self._swap_weights()
        self._poke()

    def evaluate(self, samples: int = 1) -> EvalResult:
        """Held-out success: `eval.episodes` episodes (x `samples`) on seeds never trained on."""
        if self._thread is None:  # a running loop hands queued weights over itself
            self._swap_weights()
        seeds = [HELD_OUT_SEED + i for i in range(self.cfg.eval.episodes)]

        async def play() -> list[float]:
            jobs = []
            for i, seed in enumerate(seeds):
                for j in range(samples):
                    jobs.append(self._held_out_episode(seed, f"eval/{i}/{j}"))
            return await asyncio.gather(*jobs)

        if self._loop is not None and self._thread is not None:
            returns = asyncio.run_coroutine_threadsafe(play(), self._loop).result()
        else:
            returns = asyncio.run(self.hub.serving(play()))
        correct = [sum(r >= 1.0 for r in returns[i * samples : (i + 1) * samples]) for i in range(len(seeds))]
        return EvalResult(
            pass_at_1=sum(pass_at_k(samples, c, 1) for c in correct) / len(seeds),
            pass_at_k=sum(pass_at_k(samples, c, samples) for c in correct) / len(seeds),
            k=samples,
            mean_reward=sum(returns) / len(returns),
            prompts=len(seeds),
        )

    async def _held_out_episode(self, seed: int, episode_id: str) -> float:
        runner = self._runner()
        try:
            episode = await run_episode(
                self.hub, runner, self.tokenizer, self.eval_params, seed, episode_id, turns=self.turns,
                max_context_tokens=self.context_budget,
            )
        finally:
            await runner.close()
        return sum(episode.rewards) if episode.ok else 0.0

    def metrics(self) -> dict[str, float]:
        counts = self.rollout.counts
        engine = self.engine.stats()
        wall = time.perf_counter() - self._born
        out = {
            **self.buffer.stats(),
            "rollout/engine_busy_fraction": engine.get("busy_s", 0.0) / max(wall, 1e-9),
            "rollout/engine_busy_s": engine.get("busy_s", 0.0),
            "rollout/episodes_total": float(counts["episodes"]),
            "rollout/episodes_in_flight": float(self.rollout.in_flight()),
            "rollout/episodes_cancelled_total": float(counts["cancelled"]),
            "rollout/episodes_retried_total": float(counts["retried"]),
            "rollout/groups_dropped_total": float(counts["groups_dropped"]),
            "rollout/groups_stale_cancelled_total": float(counts["groups_stale"]),
            "rollout/turns_per_episode": self.rollout.turn_total / max(counts["episodes"], 1),
            **reuse_metrics(engine),
        }
        for kind in ("raised", "timeout", "died"):
            out[f"rollout/episodes_lost_{kind}_total"] = float(counts[f"lost/{kind}"])
        return out

    def reward_report(self) -> dict:
        """Rewards come from the environment: no reward function to fail (see env metrics)."""
        return {"calls": 0, "errors": 0, "timeouts": 0, "first_failures": {}}

    def state_dict(self) -> dict:
        """Where to resume: after the last seed started. Episodes in flight are not replayed
        (nothing of them was trained on, so nothing counted is lost)."""
        return {
            "next_seed": self.rollout.next_seed,
            "swaps": self.swaps,
            "engine": self.engine.sampling_state(),
        }

    def load_state_dict(self, state: dict, version: int) -> None:
        self.rollout.next_seed = state["next_seed"]
        self.engine.load_sampling_state(state["engine"])
        self.version = self.rollout.version = version
        self.swaps = state.get("swaps", version)
        self.started_groups = self.swaps * self.quota

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._loop.call_soon_threadsafe(self._wake.set)
        if self._thread is not None:
            self._thread.join(timeout=60)
        self._thread = None
        self._loop = None

    def close(self) -> None:
        self.stop()
        self.timeline.close()
