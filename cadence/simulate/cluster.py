"""One simulated run: rollout workers and a trainer on a virtual clock.

    rollout workers (SimRolloutWorker: cadence's RolloutWorker on mock replicas)
        | a producer round at a time; its groups are delivered when its engine step ends
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

import time
from dataclasses import asdict, dataclass, field

from cadence.inference.mock import MockEngine
from cadence.rollout.buffer import SampleBuffer
from cadence.rollout.sample import Group
from cadence.simulate.clock import EventQueue
from cadence.simulate.config import SimConfig
from cadence.simulate.costs import engine_latencies, replica_slots, train_step_s, weight_sync_s
from cadence.simulate.theory import suggested_train_gpus
from cadence.simulate.worker import SimRolloutWorker


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
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.layout = layout(cfg)
        k = cfg.tick()
        self.k = k
        w = cfg.workload
        self.queue = EventQueue()
        self.workers: list[SimRolloutWorker] = []
        self.inboxes: list[SampleBuffer] = []
        engine_index = 0
        for index, (replicas, quota) in enumerate(zip(self.layout.replicas_per_worker, self.layout.quotas, strict=True)):
            engines = []
            for _ in range(replicas):
                engines.append(sim_engine(cfg, engine_index, k))
                engine_index += 1
            self.workers.append(SimRolloutWorker(
                index, engines, quota, w.group_size, cfg.cluster.alpha, prompt_ticks=max(1, round(w.prompt_tokens / k)),
                max_ticks=max(1, w.max_tokens // k), replicate=cfg.cluster.replicate_prompts, seed=cfg.run.seed + index,
            ))
            self.inboxes.append(SampleBuffer(cfg.cluster.alpha))
        self.idle = [False] * len(self.workers)
        self.version = 0
        self.training = False
        self.records: list[StepRecord] = []
        self.total_steps = cfg.run.warmup_steps + cfg.run.steps
        self._sync_s = weight_sync_s(cfg.model, cfg.trainer)

    # -- rollout ---------------------------------------------------------------
    def _round(self, i: int) -> None:
        busy, seconds = self.workers[i].step()
        finished = self.workers[i].take_finished()
        if busy:
            self.queue.after(seconds, lambda: self._round_done(i, finished))
        else:
            self.idle[i] = True  # alpha's allowance is used up: wait for weights

    def _round_done(self, i: int, finished: list[Group]) -> None:
        for group in finished:
            self.inboxes[i].put(group)
        self._maybe_train()
        self._round(i)

    # -- training --------------------------------------------------------------
    def _maybe_train(self) -> None:
        if self.training or len(self.records) >= self.total_steps:
            return
        for inbox, worker in zip(self.inboxes, self.workers, strict=True):
            inbox.evict_stale(self.version)
            if len(inbox) < worker.quota:
                return
        batch = [g for inbox, worker in zip(self.inboxes, self.workers, strict=True)
                 for g in inbox.get_batch(worker.quota, self.version, timeout=0)]
        samples = [s for g in batch for s in g.samples]
        lengths = [self.k * (len(s.prompt_ids) + len(s.response_ids)) for s in samples]
        seconds = train_step_s(self.cfg.model, self.cfg.gpu, self.cfg.trainer, lengths, self.layout.train_gpus)
        seconds += self._sync_s + (self.cfg.trainer.colocate_switch_s if self.cfg.cluster.colocate else 0.0)
        record = StepRecord(
            end_s=0.0, train_s=seconds, samples=len(samples),
            response_tokens=self.k * sum(len(s.response_ids) for s in samples),
            staleness_mean=sum(self.version - g.version for g in batch) / max(1, len(batch)),
            longest_response_tokens=self.k * max((len(s.response_ids) for s in samples), default=0),
        )
        self.training = True
        self.queue.after(seconds, lambda: self._step_done(record))

    def _step_done(self, record: StepRecord) -> None:
        record.end_s = self.queue.now
        self.records.append(record)
        self.version += 1
        self.training = False
        for i, worker in enumerate(self.workers):
            worker.update_weights({}, self.version)
            if self.idle[i]:
                self.idle[i] = False
                self.queue.after(0.0, lambda i=i: self._round(i))
        self._maybe_train()

    # -- the run ---------------------------------------------------------------
    def run(self) -> SimResult:
        began = time.process_time()
        for i in range(len(self.workers)):
            self.queue.at(0.0, lambda i=i: self._round(i))
        self.queue.run(until=lambda: len(self.records) >= self.total_steps)
        if len(self.records) < self.total_steps:
            raise RuntimeError(f"the simulation stalled after {len(self.records)} steps")
        for worker in self.workers:
            worker.rollout.close()
        result = self._result()
        result.cpu_s = time.process_time() - began
        return result

    def _result(self) -> SimResult:
        return summarise(self.cfg, self.layout, self.records, self.k, sum(w.busy_seconds() for w in self.workers))


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


def simulate(cfg: SimConfig) -> SimResult:
    """One run: an RLVR one, or an agentic one when `cfg.env` is set."""
    if cfg.env is not None:
        from cadence.simulate.agentic import AgenticSim

        return AgenticSim(cfg).run()
    return ClusterSim(cfg).run()
