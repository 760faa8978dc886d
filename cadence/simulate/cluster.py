"""One simulated run: rollout workers and a trainer on a virtual clock.

    rollout workers (cadence's RolloutWorker on mock replicas, simulate/worker.py)
        | groups played as coroutines on a virtual-time loop; an engine round's results
        | arrive when the round ends in virtual time (virtual_asyncio.py)
        v
    one SampleBuffer per worker (cadence's, with the run's alpha)
        | the trainer takes every worker's quota, oldest first, as WorkerGroup does
        v
    trainer: busy for the cost model's step time (+ weight sync, + the colocated switch),
             then pushes version v+1 to every worker (interruptible: in-flight requests go on)

Layout: an asynchronous run trains on `train_gpus` and generates on the rest;
a colocated (synchronous) run does both on all GPUs, one after the other
(alpha = 0 makes the workers wait for the trainer's weights anyway). Rollout
GPUs are cut into workers of `gpus_per_worker`, each a hub over its TP
replicas; the prompts of a step are shared out in proportion to replicas.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field

from cadence.inference.mock import MockEngine
from cadence.rollout.sample import Group
from cadence.rollout.worker import RolloutWorker
from cadence.simulate.config import SimConfig
from cadence.simulate.costs import engine_latencies, replica_slots, train_step_s, weight_sync_s
from cadence.simulate.theory import suggested_train_gpus
from cadence.simulate.virtual_asyncio import VirtualTimeLoop
from cadence.simulate.worker import rlvr_worker


def sim_engine(cfg: SimConfig, index: int, k: int, engine_class: type[MockEngine] = MockEngine,
               **extra: object) -> MockEngine:
    """Replica `index` of a simulated run: the workload's lengths (in ticks of `k` tokens) and the
    cost model's latencies, on the virtual clock."""
    w, lat = cfg.workload, engine_latencies(cfg)
    return engine_class(
        max_batch_size=replica_slots(cfg), seed=cfg.run.seed * 1_000_003 + index, length_dist=w.length_dist,
        median_tokens=max(1, round(w.median_tokens / k)), sigma=w.sigma, virtual_clock=True,
        step_latency_s=lat.step_latency_s, per_token_latency_s=lat.per_token_latency_s,
        prefill_latency_s=lat.prefill_latency_s, context_latency_s=lat.context_latency_s, **extra,
    )


@dataclass
class Layout:
    rollout_gpus: int
    train_gpus: int
    replicas_per_worker: list[int]
    quotas: list[int]


def layout(cfg: SimConfig) -> Layout:
    c, ro, n = cfg.cluster, cfg.rollout, cfg.workload.prompts_per_step
    if c.colocate:
        rollout_gpus = train_gpus = c.gpus
    else:
        train_gpus = c.train_gpus if c.train_gpus is not None else suggested_train_gpus(cfg)
        rollout_gpus = c.gpus - train_gpus
    replicas = rollout_gpus // ro.tp
    if replicas < 1:
        raise ValueError(f"{rollout_gpus} rollout GPUs cannot hold a TP={ro.tp} replica")
    per_worker = ro.gpus_per_worker // ro.tp
    counts = [per_worker] * (replicas // per_worker) + ([replicas % per_worker] if replicas % per_worker else [])
    # Prompts in proportion to replicas, largest remainders first.
    exact = [n * r / replicas for r in counts]
    quotas = [int(q) for q in exact]
    for i in sorted(range(len(counts)), key=lambda i: quotas[i] - exact[i])[: n - sum(quotas)]:
        quotas[i] += 1
    return Layout(rollout_gpus, train_gpus, counts, quotas)


@dataclass
class StepRecord:
    end_s: float  # virtual time the step's weights were pushed
    train_s: float  # trainer busy time, weight sync and switch included
    samples: int
    response_tokens: int
    staleness_mean: float
    longest_response_tokens: int


@dataclass
class SimResult:
    gpus: int
    rollout_gpus: int
    train_gpus: int
    alpha: int
    colocate: bool
    tick_tokens: int
    steps: list[StepRecord] = field(default_factory=list)
    warmup_steps: int = 0
    engine_busy_fraction: float = 0.0
    samples_per_s: float = 0.0
    tokens_per_s: float = 0.0
    step_s: float = 0.0
    cpu_s: float = 0.0  # CPU seconds the simulation took (not virtual time)
    counts: dict[str, float] = field(default_factory=dict)  # agentic runs: episodes, lost/<kind>, turns, ...

    def to_dict(self) -> dict:
        return asdict(self)


class ClusterSim:
    """An RLVR run; `AgenticSim` (agentic.py) is the same run with episodes."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.layout = layout(cfg)
        self.k = cfg.tick()
        self.total_steps = cfg.run.warmup_steps + cfg.run.steps
        self.records: list[StepRecord] = []
        self.version = 0
        self._sync_s = weight_sync_s(cfg.model, cfg.trainer)

    def _engine(self, index: int) -> MockEngine:
        return sim_engine(self.cfg, index, self.k)

    def _worker(self, index: int, engines: list[MockEngine], quota: int, arrived: asyncio.Event) -> RolloutWorker:
        cfg, w, k = self.cfg, self.cfg.workload, self.k
        return rlvr_worker(
            index, engines, quota, w.group_size, cfg.cluster.alpha, arrived, prompt_ticks=max(1, round(w.prompt_tokens / k)),
            max_ticks=max(1, w.max_tokens // k), replicate=cfg.cluster.replicate_prompts, seed=cfg.run.seed + index,
        )

    def _build(self) -> None:
        self.arrived = asyncio.Event()
        self.workers: list[RolloutWorker] = []
        engine_index = 0
        for index, (replicas, quota) in enumerate(zip(self.layout.replicas_per_worker, self.layout.quotas, strict=True)):
            engines = [self._engine(engine_index + i) for i in range(replicas)]
            engine_index += replicas
            self.workers.append(self._worker(index, engines, quota, self.arrived))

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
            batch += worker.take_batch(self.version) if worker.quota else []
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
                response_tokens=self.k * sum(sum(s.loss_mask) if s.loss_mask else len(s.response_ids) for s in samples),
                staleness_mean=sum(self.version - g.version for g in batch) / max(1, len(batch)),
                longest_response_tokens=self.k * max((len(s.response_ids) for s in samples), default=0),
            ))
            self.version += 1
            for worker in self.workers:
                worker.update_weights({}, self.version)

    async def _main(self) -> None:
        self._build()
        stopping = asyncio.Event()
        tasks = [asyncio.ensure_future(w.run(stopping.is_set)) for w in self.workers]
        try:
            await self._train()
        finally:
            stopping.set()
            for worker in self.workers:
                worker._poke()
            await asyncio.gather(*tasks)
            for worker in self.workers:
                await worker.cancel()

    def run(self) -> SimResult:
        began = time.process_time()
        loop = VirtualTimeLoop()
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()
        busy = sum(r.engine.stats()["busy_s"] for w in self.workers for r in w.hub.replicas)
        result = summarise(self.cfg, self.layout, self.records, self.k, busy)
        result.counts = self._counts()
        result.cpu_s = time.process_time() - began
        return result

    def _counts(self) -> dict[str, float]:
        return {}


def summarise(cfg: SimConfig, lay: Layout, records: list[StepRecord], k: int, engine_busy_s: float) -> SimResult:
    """Throughput over the measured steps (after the warm-up ones) and the engines' busy share."""
    warm = cfg.run.warmup_steps
    measured = records[warm:]
    start = records[warm - 1].end_s if warm else 0.0
    elapsed = records[-1].end_s - start
    return SimResult(
        gpus=cfg.cluster.gpus, rollout_gpus=lay.rollout_gpus, train_gpus=lay.train_gpus,
        alpha=cfg.cluster.alpha, colocate=cfg.cluster.colocate, tick_tokens=k, steps=records,
        warmup_steps=warm, engine_busy_fraction=engine_busy_s / (sum(lay.replicas_per_worker) * records[-1].end_s),
        samples_per_s=sum(r.samples for r in measured) / elapsed,
        tokens_per_s=sum(r.response_tokens for r in measured) / elapsed,
        step_s=elapsed / len(measured),
    )
