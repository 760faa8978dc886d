"""One simulated agentic run: episodes of generation turns and environment steps on a cluster.

    SimEpisodeWorker (cadence's EpisodeWorker on mock replicas), one per rollout node
        its EnvRollout (env-level async) or LockstepRollout (the synchronous baseline) runs
        run_episode for every episode: generate a turn on the hub, step the environment
        (EnvRunner: timeout, retries; AsyncLatencyEnv: cadence's latency draws), repeat
        | finished groups land in the worker's SampleBuffer (alpha's freshness rule)
        v
    trainer coroutine: takes every worker's quota, is busy for the cost model's step time
        (+ weight sync, + the colocated switch, during which colocated engines are held),
        then pushes version v+1 to every worker (EpisodeWorker.update_weights)

All of it is cadence's asyncio code, run on a loop whose clock is virtual
(`virtual_asyncio.py`): an environment's 10 s step is `asyncio.sleep(10)` in
the latency wrapper, which takes 10 virtual seconds and no real time, and an
engine round takes what the decode cost model says it costs. Only the
worker's constructor, the environment (turns and rewards without a world)
and the turn format (lengths without text) are the simulator's own.
"""

from __future__ import annotations

import asyncio
import threading
import time

from cadence.envs.latency import with_latency
from cadence.envs.runner import EnvRunner
from cadence.inference.mock import MockEngine
from cadence.inference.types import GenRequest, GenResult, SamplingParams
from cadence.rollout.buffer import SampleBuffer
from cadence.rollout.env_rollout import EnvRollout
from cadence.rollout.episode_worker import EpisodeWorker
from cadence.rollout.lockstep import LockstepRollout
from cadence.rollout.sample import Group
from cadence.simulate.cluster import SimResult, StepRecord, layout, sim_engine, summarise
from cadence.simulate.config import EnvSpec, SimConfig
from cadence.simulate.costs import train_step_s, weight_sync_s
from cadence.simulate.stand_ins import LengthTokenizer, LengthTurns, TurnsEnv, answer_text
from cadence.simulate.virtual_asyncio import VirtualTimeHub, VirtualTimeLoop
from cadence.simulate.worker import NoTimeline


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


class _SignalledBuffer(SampleBuffer):
    """A SampleBuffer that also wakes the simulated trainer when a group arrives."""

    def __init__(self, async_ratio: int, arrived: asyncio.Event) -> None:
        super().__init__(async_ratio)
        self.arrived = arrived

    def put(self, group: Group) -> None:
        super().put(group)
        self.arrived.set()


class SimEpisodeWorker(EpisodeWorker):
    """cadence's EpisodeWorker with mock replicas behind a virtual-time hub.

    Its admission loop (`_main`: admit under alpha, swap weights between engine rounds,
    cancel extra groups that can no longer be fresh), `_allowed_groups`, `_swap_weights` and
    `update_weights` are inherited unchanged; the constructor sets the fields they use, as
    EpisodeWorker's does, without a model, a tokenizer or an environment registry to load."""

    def __init__(
        self, index: int, engines: list[MockEngine], quota: int, cfg: SimConfig, env: EnvSpec,
        arrived: asyncio.Event, max_ticks: int,
    ) -> None:
        w, k = cfg.workload, cfg.tick()
        self.index = index
        self.background = True
        self.cfg = None  # the sim's EnvSpec stands in for RunConfig.env (see _runner)
        self.env = env
        self.quota = quota
        self.alpha = cfg.cluster.alpha
        self.engines = engines
        self.engine = engines[0]
        self.hub = VirtualTimeHub(engines)
        self.params = SamplingParams(max_new_tokens=max_ticks)
        self.buffer = _SignalledBuffer(self.alpha, arrived)
        self.extra_groups = env.extra_groups
        turns = LengthTurns(max(1, round(w.prompt_tokens / k)), max(1, round(env.observation_tokens / k)))
        lockstep = {"batch_groups": quota} if env.mode == "lockstep" else {}
        self.rollout = (LockstepRollout if lockstep else EnvRollout)(
            self.hub, self._runner, LengthTokenizer(1), self.params, self.buffer, w.group_size,
            redundancy=env.redundancy, turns=turns, first_seed=10**6 * index,
            max_context_tokens=turns.prompt_ticks + env.turns * (max_ticks + turns.observation_ticks) + 1,
            **lockstep,
        )
        self._env_seed = cfg.run.seed * 1_000_003 + 10**6 * index
        self.version = 0
        self.swaps = 0
        self.started_groups = 0
        self.handed_out = 0
        self._slot_lock = threading.Lock()
        self._new_weights = None
        self._loop = None
        self._wake = None
        self._stopping = None
        self._thread = None
        self._error = None
        self._born = 0.0
        self.timeline = NoTimeline()

    def _runner(self) -> EnvRunner:
        e = self.env
        return EnvRunner(self._make_env, step_timeout_s=e.step_timeout_s, action_tag="answer")

    async def _make_env(self) -> object:
        # async, so the runner builds it on the loop (virtual time) and not in its thread
        self._env_seed += 1
        e = self.env
        inner = TurnsEnv(e.min_turns or e.turns, e.turns, self._env_seed)
        return with_latency(inner, **e.latency.model_dump(), instance=(self.index, self._env_seed))

    def busy_seconds(self) -> float:
        return sum(e.stats()["busy_s"] for e in self.engines)

    def stop_soon(self) -> None:
        assert self._stopping is not None and self._wake is not None
        self._stopping.set()
        self._wake.set()


class AgenticSim:
    def __init__(self, cfg: SimConfig) -> None:
        if cfg.env is None:
            raise ValueError("an agentic simulation needs an env section (env.turns=..., env.latency.mean_s=...)")
        self.cfg = cfg
        self.env = cfg.env
        self.layout = layout(cfg)
        self.k = cfg.tick()
        self.total_steps = cfg.run.warmup_steps + cfg.run.steps
        self.records: list[StepRecord] = []
        self.version = 0
        self._sync_s = weight_sync_s(cfg.model, cfg.trainer)

    def _build(self) -> None:
        cfg, w, k = self.cfg, self.cfg.workload, self.k
        self.arrived = asyncio.Event()
        self.workers: list[SimEpisodeWorker] = []
        engine_index = 0
        for index, (replicas, quota) in enumerate(zip(self.layout.replicas_per_worker, self.layout.quotas, strict=True)):
            engines = []
            for _ in range(replicas):
                engines.append(sim_engine(cfg, engine_index, k, PrefixCachingEngine, answer_fn=answer_text))
                engine_index += 1
            self.workers.append(SimEpisodeWorker(index, engines, quota, cfg, self.env, self.arrived,
                                                 max_ticks=max(1, w.max_tokens // k)))

    async def _next_batch(self) -> list[Group]:
        """Every worker's quota of fresh groups, oldest first (as WorkerGroup takes them)."""
        while True:
            for worker in self.workers:
                worker.buffer.evict_stale(self.version)
            if all(len(w.buffer) >= w.quota for w in self.workers if w.quota):
                break
            self.arrived.clear()
            await self.arrived.wait()
        batch = []
        for worker in self.workers:
            batch += worker.buffer.get_batch(worker.quota, self.version, timeout=0)
            worker.handed_out += worker.quota
            worker._poke()
        return batch

    async def _train(self) -> None:
        cfg, loop = self.cfg, asyncio.get_running_loop()
        for _ in range(self.total_steps):
            batch = await self._next_batch()
            samples = [s for g in batch for s in g.samples]
            lengths = [self.k * (len(s.prompt_ids) + len(s.response_ids)) for s in samples]
            seconds = train_step_s(cfg.model, cfg.gpu, cfg.trainer, lengths, self.layout.train_gpus)
            seconds += self._sync_s + (cfg.trainer.colocate_switch_s if cfg.cluster.colocate else 0.0)
            if cfg.cluster.colocate:  # the GPUs train: no engine round until the step is over
                for worker in self.workers:
                    worker.hub.hold_until(loop.time() + seconds)
            await asyncio.sleep(seconds)
            self.records.append(StepRecord(
                end_s=loop.time(), train_s=seconds, samples=len(samples),
                response_tokens=self.k * sum(sum(s.loss_mask) for s in samples),
                staleness_mean=sum(self.version - g.version for g in batch) / max(1, len(batch)),
                longest_response_tokens=self.k * max((len(s.response_ids) for s in samples), default=0),
            ))
            self.version += 1
            for worker in self.workers:
                worker.update_weights({}, self.version)

    async def _main(self) -> None:
        self._build()
        ready = threading.Event()
        tasks = [asyncio.ensure_future(w._main(ready)) for w in self.workers]
        try:
            await self._train()
        finally:
            for worker in self.workers:
                worker.stop_soon()
            await asyncio.gather(*tasks)

    def run(self) -> SimResult:
        began = time.process_time()
        loop = VirtualTimeLoop()
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()
        result = summarise(self.cfg, self.layout, self.records, self.k, sum(w.busy_seconds() for w in self.workers))
        counts: dict[str, float] = {}
        for worker in self.workers:
            for key, value in worker.rollout.counts.items():
                counts[key] = counts.get(key, 0) + value
            counts["turns"] = counts.get("turns", 0) + worker.rollout.turn_total
        result.counts = counts
        result.cpu_s = time.process_time() - began
        return result


def simulate_agentic(cfg: SimConfig) -> SimResult:
    return AgenticSim(cfg).run()
