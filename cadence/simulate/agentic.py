"""One simulated agentic run: episodes of generation turns and environment steps on a cluster.

    cadence's RolloutWorker on mock replicas, one per rollout node
        its EpisodeProducer (env-level async) or LockstepEpisodeProducer (the synchronous baseline) runs
        run_episode for every episode: generate a turn on the hub, step the environment
        (EnvRunner: timeout, retries; AsyncLatencyEnv: cadence's latency draws), repeat
        | finished groups land in the worker's SampleBuffer (alpha's freshness rule)
        v
    trainer coroutine: takes every worker's quota, is busy for the cost model's step time
        (+ weight sync, + the colocated switch, during which colocated engines are held),
        then pushes version v+1 to every worker (RolloutWorker.update_weights)

All of it is cadence's asyncio code, run on a loop whose clock is virtual
(`virtual_asyncio.py`): an environment's 10 s step is `asyncio.sleep(10)` in
the latency wrapper, which takes 10 virtual seconds and no real time, and an
engine round takes what the decode cost model says it costs. Only the
worker's constructor, the environment (turns and rewards without a world)
and the turn format (lengths without text) are the simulator's own.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from cadence.envs.latency import with_latency
from cadence.envs.runner import EnvRunner
from cadence.inference.mock import MockEngine
from cadence.inference.types import GenRequest, GenResult, SamplingParams
from cadence.rollout.episode_producer import EpisodeProducer
from cadence.rollout.lockstep import LockstepEpisodeProducer
from cadence.rollout.worker import RolloutWorker
from cadence.simulate.cluster import ClusterSim, SimResult, sim_engine
from cadence.simulate.config import SimConfig
from cadence.simulate.stand_ins import LengthTokenizer, LengthTurns, TurnsEnv, answer_text
from cadence.simulate.virtual_asyncio import VirtualTimeHub
from cadence.simulate.worker import sim_worker


class PrefixCachingEngine(MockEngine):
    """The mock engine with a prefix cache (vLLM's), for the cost only: an episode's turn
    prefills just the tokens its previous turn did not leave in the cache (that turn's
    output is cached; the new observation is not). Without it every turn would prefill its
    whole context again, a cost that grows with the square of the turns."""

    def __init__(self, *, prefill_latency_s: float, **settings: object) -> None:
        super().__init__(prefill_latency_s=0.0, **settings)  # charged here instead, cache-aware
        self.prefill_token_s = prefill_latency_s
        self._cached: dict[str, int] = {}  # cache key (the episode) -> tokens its KV cache holds
        self._keys: dict[str, str] = {}  # request id -> cache key

    def add_request(self, req: GenRequest) -> None:
        super().add_request(req)
        if req.cache_key is not None:
            self._keys[req.request_id] = req.cache_key

    def step(self) -> list[GenResult]:
        free = self.max_batch_size - len(self._running)
        admitted = list(self._waiting)[: max(0, free)]  # what MockEngine.step admits now
        new_tokens = 0
        for seq in admitted:
            cached = self._cached.get(self._keys.get(seq.req.request_id, ""), 0)
            new_tokens += len(seq.req.prompt_ids) - min(cached, len(seq.req.prompt_ids))
        done = super().step()
        if new_tokens:
            cost = self.prefill_token_s * new_tokens
            self._advance(cost)
            self._stats["busy_s"] += cost
        for result in done:
            key = self._keys.pop(result.request_id, None)
            if key is not None:
                self._cached[key] = len(result.prompt_ids) + len(result.token_ids)
        return done

    def abort(self, request_id: str) -> GenResult | None:
        self._keys.pop(request_id, None)
        return super().abort(request_id)

    def forget(self, cache_key: str) -> None:
        """The episode ended: its cache entry goes (the hub calls this)."""
        self._cached.pop(cache_key, None)


class AgenticSim(ClusterSim):
    """The simulated run (ClusterSim) with episodes: the real worker over the real
    `EpisodeProducer` (or `LockstepEpisodeProducer`), environments with the latency draws and no world."""

    def __init__(self, cfg: SimConfig) -> None:
        if cfg.env is None:
            raise ValueError("an agentic simulation needs an env section (env.turns=..., env.latency.mean_s=...)")
        super().__init__(cfg)
        self.env = cfg.env

    def _engine(self, index: int) -> MockEngine:
        return sim_engine(self.cfg, index, self.k, PrefixCachingEngine, answer_fn=answer_text)

    def _worker(self, index: int, engines: list[MockEngine], quota: int, arrived: asyncio.Event) -> RolloutWorker:
        cfg, env, w, k = self.cfg, self.env, self.cfg.workload, self.k
        max_ticks = max(1, w.max_tokens // k)
        hub = VirtualTimeHub(engines)
        turns = LengthTurns(max(1, round(w.prompt_tokens / k)), max(1, round(env.observation_tokens / k)))
        lockstep = {"batch_groups": quota} if env.mode == "lockstep" else {}
        env_seed = [cfg.run.seed * 1_000_003 + 10**6 * index]

        async def make_env() -> object:
            # async, so the runner builds it on the loop (virtual time) and not in its thread
            env_seed[0] += 1
            inner = TurnsEnv(env.min_turns or env.turns, env.turns, env_seed[0])
            return with_latency(inner, **env.latency.model_dump(), instance=(index, env_seed[0]))

        producer = (LockstepEpisodeProducer if lockstep else EpisodeProducer)(
            hub, lambda: EnvRunner(make_env, step_timeout_s=env.step_timeout_s, action_tag="answer"),
            LengthTokenizer(1), SamplingParams(max_new_tokens=max_ticks), w.group_size,
            redundancy=env.redundancy, turns=turns, first_seed=10**6 * index,
            max_context_tokens=turns.prompt_ticks + env.turns * (max_ticks + turns.observation_ticks) + 1,
            **lockstep,
        )
        return sim_worker(index, hub, producer, quota, cfg.cluster.alpha, arrived, extra=env.extra_groups)

    def _counts(self) -> dict[str, float]:
        """Episodes, lost ones by kind, retries, cancels, groups and turns, summed over workers."""
        counts: Counter[str] = Counter()
        for worker in self.workers:
            producer = worker.producer
            failures = producer.failures  # type: ignore[attr-defined]
            counts.update({
                "episodes": failures.played, "retried": failures.retried, "cancelled": failures.cancelled,
                "groups": failures.groups_done, "groups_dropped": failures.groups_dropped,
                "groups_stale": producer.stale_cancelled, "turns": producer.turn_total,  # type: ignore[attr-defined]
            })
            counts.update({f"lost/{kind}": n for kind, n in failures.lost_by_kind.items()})
        return {key: float(n) for key, n in counts.items()}


def simulate_agentic(cfg: SimConfig) -> SimResult:
    return AgenticSim(cfg).run()
