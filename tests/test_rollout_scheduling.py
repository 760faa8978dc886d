"""Rollout scheduling: prompt replication, whole-group admission, mean filters, weight swaps,
the alpha admission gate and where a resumed worker picks up the prompt stream."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass

import pytest

from cadence.assemble import ConfiguredRolloutWorker, rollout_workers
from cadence.config import ConfigError, load_config
from cadence.data.tasks import Prompt
from cadence.inference.hub import InferenceHub
from cadence.inference.mock import MockEngine
from cadence.inference.types import SamplingParams
from cadence.models.loading import load_tokenizer
from cadence.observe.metrics import read_jsonl
from cadence.rollout.prompts import PromptStream
from cadence.rollout.render import PromptRenderer
from cadence.rollout.rlvr import GuardScorer, RLVRProducer, keeps
from cadence.rollout.sample import Group, Sample
from cadence.rollout.worker import RolloutWorker
from cadence.runtime.actors import Local
from cadence.runtime.placement import WorkerGroup, join_parts
from tests.inference.hub_probe import in_flight


@dataclass
class _Outcome:
    reward: float
    error: str | None = None


class _ConstantReward:
    async def score(self, prompt, response):
        return _Outcome(1.0)


class _CountingHub(InferenceHub):
    """Records the requests in flight (queued in the hub or held by the engine) at each round."""

    def __init__(self, engines):
        super().__init__(engines)
        self.held: list[int] = []

    async def pump(self) -> bool:
        self.held.append(in_flight(self)[0])
        return await super().pump()


def _producer(replicate: bool, slots: int = 8, group_size: int = 4, answers: int | None = None) -> RLVRProducer:
    engine = MockEngine(max_batch_size=slots, seed=0, median_tokens=6, sigma=1.0, max_tokens=40, virtual_clock=True)
    prompts = PromptStream([Prompt(id=f"p{i}", text=f"{i}+1=", answer=str(i + 1)) for i in range(20)], seed=0)
    return RLVRProducer(
        _CountingHub([engine]), PromptRenderer(load_tokenizer("builtin")), prompts, _ConstantReward(), SamplingParams(max_new_tokens=40),
        answers or group_size, replicate=replicate, slots=slots,
    )


def _play(producer: RLVRProducer, groups: int) -> list[Group]:
    """Play `groups` groups at once, to completion."""

    async def main() -> list[Group]:
        plays = [producer.play(gid, gid) for gid in range(groups)]
        return await producer.hub.serving(asyncio.gather(*plays))

    return asyncio.run(main())


def test_replicated_answers_queue_in_the_engine_and_fill_any_free_slot():
    producer = _producer(replicate=True)
    groups = _play(producer, 5)  # 20 one-answer requests for 8 slots
    assert len(groups) == 5 and all(len(g.samples) == 4 for g in groups)
    assert max(producer.hub.held) == 20  # all queued in the engine: answers take single slots as they free up
    assert producer.stats.samples == sum(producer.stats.finish_reasons.values()) == 20


def test_whole_groups_enter_only_when_all_their_slots_are_free():
    producer = _producer(replicate=False)
    groups = _play(producer, 5)
    # Two groups fit in 8 slots and the engine never holds more: a group waits for 4 free ones.
    assert max(producer.hub.held) == 8
    assert [g.group_id for g in groups] == [0, 1, 2, 3, 4]
    assert all(len(g.samples) == 4 for g in groups)


@pytest.mark.parametrize("index, share", [(0, 2), (1, 1), (2, 1)])
def test_a_worker_generates_only_its_share_of_each_group(index, share):
    """Prompt replication over 3 workers: answer j of a group of 4 is worker j mod 3's."""
    cfg = load_config(None, ["rollout.group_size=4", "rollout.prompts_per_step=2", "rollout.engine.backend=mock",
                             "rollout.engine.mock.median_tokens=4", "trainer.steps=2", "task.test_size=4"])
    worker = ConfiguredRolloutWorker(cfg, index=index, workers=3, background=False)
    try:
        assert worker.quota == 2  # every worker takes every prompt
        batch = worker.get_batch(0, timeout=60)
        assert [len(g.samples) for g in batch] == [share, share]
        assert [g.group_id for g in batch] == [0, 1]  # the same ids on every worker: WorkerGroup joins them
    finally:
        worker.close()


def _part(group_id: int, rewards: list[float]) -> Group:
    g = Group(group_id=group_id, prompt_id=f"p{group_id}")
    g.samples = [Sample(f"p{group_id}", group_id, [1], [2], [-0.1], r, 0, "stop") for r in rewards]
    return g


def test_join_parts_rebuilds_whole_groups_from_worker_shares():
    joined = join_parts([[_part(0, [1, 0]), _part(1, [0, 0])], [_part(0, [1, 1]), _part(1, [1, 0])]])
    assert [g.group_id for g in joined] == [0, 1]
    assert [g.rewards for g in joined] == [[1, 0, 1, 1], [0, 0, 1, 0]]


def test_mean_filters_drop_all_wrong_and_all_right_groups():
    assert not keeps(_part(0, [0, 0, 0, 0]), None, 0.0, 1.0)
    assert not keeps(_part(0, [1, 1, 1, 1]), None, 0.0, 1.0)
    assert keeps(_part(0, [1, 0, 0, 0]), None, 0.0, 1.0)
    assert keeps(_part(0, [0, 0, 0, 0]), None, None, 0.75) and not keeps(_part(0, [1, 1, 1, 0]), None, None, 0.75)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["runtime.rollout_workers=4", "rollout.group_size=2"], "rollout.replicate_prompts"),
        (["runtime.rollout_workers=2", "rollout.filter_min_std=0"], "rollout.replicate_prompts=false"),
    ],
)
def test_replication_config_errors_name_the_fix(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(None, ["runtime.kind=ray", *overrides])


def _worker(interrupt: bool) -> ConfiguredRolloutWorker:
    cfg = load_config(
        None,
        [
            "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.async_ratio=1",
            # Responses of ~0.25 s (a long tail of them past 1 s): when the trainer pushes new
            # weights some are still being written, however late a loaded machine runs its thread.
            "rollout.engine.backend=mock", "rollout.engine.mock.median_tokens=60",
            "rollout.engine.mock.virtual_clock=false", "rollout.engine.mock.step_latency_s=0.004",
            "rollout.max_new_tokens=400", f"rollout.interrupt_on_update={str(interrupt).lower()}",
            "trainer.steps=4", "task.test_size=4",
        ],
    )
    return ConfiguredRolloutWorker(cfg)


@pytest.mark.parametrize("interrupt", [True, False])
def test_weight_swap_interrupts_or_waits_for_in_flight_requests(interrupt):
    made = time.perf_counter()
    worker = _worker(interrupt)
    born = time.perf_counter()
    worker.start()
    try:
        samples = []
        for version in range(3):
            # A worker that never fills the batch fails the test in a minute rather than ten.
            samples += [s for g in worker.get_batch(version, timeout=60) for s in g.samples]
            worker.update_weights({}, version + 1)  # returns at once; swapped between engine steps
        asked = time.perf_counter()
        metrics = worker.metrics()
        answered = time.perf_counter()
    finally:
        worker.close()
    # The busy fraction is busy seconds over the worker's lifetime, which lies between these spans.
    busy = metrics["rollout/engine_busy_s"]
    assert busy > 0
    assert busy / (answered - made) <= metrics["rollout/engine_busy_fraction"] <= busy / (asked - born)
    spanned = [s for s in samples if s.finish_version != s.version]
    if interrupt:
        assert spanned  # long responses in flight continued under the next version
    else:
        assert not spanned  # every response finished on the weights that started it
    # Later weights were swapped in and generated with. (Not necessarily version 1: a worker
    # still finishing its version-0 requests may find version 2 queued already, and the newest
    # weights win.)
    assert min(s.version for s in samples) == 0 and max(s.version for s in samples) >= 1


@pytest.fixture
def mock_worker():
    """Makes foreground workers (no thread: the test drives them) on the mock engine's virtual
    clock, and closes them after the test (an unclosed worker's groups in flight were destroyed
    pending at exit: 'Task was destroyed but it is pending!' in CI)."""
    made: list[ConfiguredRolloutWorker] = []

    def make(alpha: int, quota: int = 2, steps: int = 8) -> ConfiguredRolloutWorker:
        cfg = load_config(
            None,
            [
                f"rollout.prompts_per_step={quota}", "rollout.group_size=2", f"rollout.async_ratio={alpha}",
                "rollout.engine.backend=mock", "rollout.engine.mock.median_tokens=6",
                "rollout.engine.mock.virtual_clock=true", "rollout.max_new_tokens=40",
                f"trainer.steps={steps}", "task.test_size=4",
            ],
        )
        made.append(ConfiguredRolloutWorker(cfg, background=False))
        return made[-1]

    yield make
    for worker in made:
        worker.close()
        assert worker._own_loop is None or worker._own_loop.is_closed()


def _settle(worker: RolloutWorker, most: int) -> None:
    """Run the worker until it has nothing left to do (all it may start is started and done),
    failing as soon as it draws more than `most` prompts in all."""

    def idle() -> bool:
        drawn = worker.keys.next
        assert drawn <= most, f"{drawn} prompts drawn, at most {most} allowed"
        return not worker._tasks

    worker._loop.run_until_complete(worker.run(idle))


def _train(worker: RolloutWorker, versions: range) -> list[list[str]]:
    """Stand in for the trainer: each version's batch (its prompt ids), then the next weights."""
    steps = []
    for version in versions:
        steps.append(sorted(g.prompt_id for g in worker.get_batch(version)))
        worker.update_weights({}, version + 1)
    return steps


@pytest.mark.parametrize("alpha", [0, 1, 2])
def test_a_worker_starts_exactly_the_groups_alpha_allows(alpha, mock_worker):
    worker = mock_worker(alpha)
    quota = worker.quota
    staleness = []
    for version in range(5):
        allowed = (version + alpha + 1) * quota
        _settle(worker, most=allowed)
        # Not fewer either: the gate opens by one quota per version, so the engine never idles
        # below the allowance, and what was not trained on yet waits in the buffer.
        assert worker.keys.next == allowed
        assert len(worker.buffer) == (alpha + 1) * quota
        staleness.append([version - g.version for g in worker.get_batch(version)])
        worker.update_weights({}, version + 1)
    # Oldest groups first: staleness climbs to alpha and stays there; alpha = 0 never goes stale.
    assert staleness == [[min(version, alpha)] * quota for version in range(5)]


def test_a_resumed_worker_continues_the_prompt_sequence_exactly(mock_worker):
    whole = mock_worker(alpha=0)
    first = _train(whole, range(3))
    state = whole.state_dict()
    rest = _train(whole, range(3, 6))
    prompts = [p for step in first + rest for p in step]
    assert len(set(prompts)) == len(prompts) == 12  # one epoch: no prompt twice

    resumed = mock_worker(alpha=0)
    resumed.update_weights({}, 3)
    resumed.load_state_dict(state, 3)
    assert _train(resumed, range(3, 5)) == rest[:2]
    # Resumed twice: the second checkpoint's cursor counts from where the first one left off.
    again = mock_worker(alpha=0)
    again.update_weights({}, 5)
    again.load_state_dict(resumed.state_dict(), 5)
    assert _train(again, range(5, 6)) == rest[2:]


def test_the_data_order_does_not_depend_on_the_run_length(mock_worker):
    """A resume with more (or fewer) trainer.steps keeps the prompt order it started with."""
    orders = []
    for steps in (3, 400):
        worker = mock_worker(alpha=0, steps=steps)
        orders.append([worker.producer.stream.at(i).id for i in range(50)])
    assert orders[0] == orders[1]


def test_a_resumed_asynchronous_worker_refills_alpha_versions_of_groups(mock_worker):
    alpha = 1
    whole = mock_worker(alpha)
    _train(whole, range(3))
    state = whole.state_dict()
    resumed = mock_worker(alpha)
    resumed.update_weights({}, 3)
    resumed.load_state_dict(state, 3)
    # Nothing survived the restart, so it starts the groups of versions 3 .. 3 + alpha at once
    # (the stream passes over positions trained before the checkpoint, so count the groups).
    _settle(resumed, most=10**6)
    assert resumed.started_groups - 3 * resumed.quota == (alpha + 1) * resumed.quota
    staleness = []
    for version in (3, 4):
        staleness += [version - g.version for g in resumed.get_batch(version)]
        resumed.update_weights({}, version + 1)
    assert staleness == [0, 0, 1, 1]  # the groups started at version 3 serve two versions


class _Reporting:
    def __init__(self, metrics: dict[str, float]) -> None:
        self._metrics = metrics

    def metrics(self) -> dict[str, float]:
        return self._metrics


def test_worker_group_adds_counts_and_averages_fractions():
    group = WorkerGroup.__new__(WorkerGroup)  # the merge alone: no workers started
    group.kind, group.workers = "inline", [
        Local(_Reporting({"rollout/samples_total": 8.0, "rollout/engine_busy_fraction": 0.25})),
        Local(_Reporting({"rollout/samples_total": 4.0, "rollout/engine_busy_fraction": 0.75})),
    ]
    assert group.metrics() == {"rollout/samples_total": 12.0, "rollout/engine_busy_fraction": 0.5}


@pytest.mark.parametrize("alpha", [0, 1])
def test_an_inline_worker_generates_in_its_own_thread_only_when_asynchronous(alpha):
    # Synchronous training alternates generation and training anyway; a second thread would
    # only bring a second OpenMP team competing for the trainer's cores.
    cfg = load_config(
        None, [f"rollout.async_ratio={alpha}", "rollout.engine.backend=mock", "trainer.steps=2", "task.test_size=4"]
    )
    group = rollout_workers(cfg)
    try:
        assert group.workers[0].obj.background is (alpha > 0)
    finally:
        group.close()


def test_an_asynchronous_resume_trains_every_prompt_once_whatever_order_groups_finished_in(mock_worker):
    """With alpha > 0 a later group may finish first; the checkpoint records which stream
    positions were trained on, so the resumed run neither repeats nor skips a prompt."""
    alpha = 1
    mock_worker(alpha)  # the second worker made in a process draws the lengths that reorder groups
    whole = mock_worker(alpha, quota=2)
    first = [p for step in _train(whole, range(3)) for p in step]
    state = whole.state_dict()
    assert state["keys"]["trained_above"] or whole.keys.trained_below == 6, "no group finished out of order"
    resumed = mock_worker(alpha, quota=2)
    resumed.update_weights({}, 3)
    resumed.load_state_dict(state, 3)
    second = [p for step in _train(resumed, range(3, 6)) for p in step]  # within one epoch
    trained = first + second
    assert len(set(trained)) == len(trained)  # nothing twice
    # Nothing skipped: every stream position below the final watermark was trained on.
    stream = resumed.producer.stream
    owed = {stream.at(i).id for i in range(resumed.keys.trained_below)}
    assert owed <= set(trained)
    # And the keys it counts as trained are the prompts trained, each once. (Not how far the
    # watermark got: a slow group dropped as stale holds it back, by design.)
    assert resumed.keys.trained_below + len(resumed.keys.trained_above) == len(trained) == 12


class _RecordingProducer:
    """A producer whose groups never finish; it records what the worker tells it."""

    needs_running_loop = False
    first_key = 0

    def __init__(self) -> None:
        self.weights: list[tuple[int, int | None]] = []

    def on_weights(self, version: int, cancel_before: int | None) -> None:
        self.weights.append((version, cancel_before))

    def close(self) -> None:
        pass

    async def stop(self) -> None:
        pass


@pytest.mark.parametrize("alpha, extra, expected", [(1, 2, 2), (2, 1, 1), (1, 0, None)])
def test_extra_groups_that_can_no_longer_be_fresh_are_cancelled_at_a_weight_push(alpha, extra, expected):
    """At version v a group started before v - alpha can only be dropped as stale: with extra groups
    in flight the worker tells the producer to cancel those; without, nothing is cancelled."""
    engine = MockEngine(max_batch_size=4, virtual_clock=True)
    producer = _RecordingProducer()
    worker = RolloutWorker(producer, InferenceHub([engine]), quota=2, alpha=alpha, extra=extra, background=False)
    worker.update_weights({}, 3)
    assert producer.weights == [(3, expected)] and worker.version == 3 and worker.swaps == 1
    worker.close()


def test_the_rollout_worker_is_a_threaded_ray_actor():
    """Ray makes a class with any `async def` an asyncio actor: its calls would share one event
    loop, a blocking get_batch would stall it and evaluate could not run the worker's own loop
    (`cadence train runtime.kind=ray rollout.async_ratio=2` failed at its first evaluation)."""
    import inspect

    coroutines = [name for name, member in inspect.getmembers(ConfiguredRolloutWorker)
                  if inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member)]
    assert coroutines == []


class _ReversedGuard:
    """A reward guard whose workers finish each batch last pair first; 'boom' fails its future."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def submit_many(self, pairs):
        self.batches.append(len(pairs))
        futures = [concurrent.futures.Future() for _ in pairs]

        def finish():
            for (_, response), future in reversed(list(zip(pairs, futures, strict=True))):
                if response == "boom":
                    future.set_exception(RuntimeError("the guard broke"))
                else:
                    future.set_result(_Outcome(float(len(response))))

        threading.Thread(target=finish).start()
        return futures


def test_the_guard_scorer_sends_a_rounds_answers_as_one_batch_and_hands_each_its_own_outcome():
    guard = _ReversedGuard()
    scorer = GuardScorer(guard)
    prompt = Prompt(id="p", text="1+1=", answer="2")

    async def main():
        first = await asyncio.gather(*(scorer.score(prompt, "x" * n) for n in (1, 2, 3)))
        second = await asyncio.gather(scorer.score(prompt, "boom"), scorer.score(prompt, "yy"), return_exceptions=True)
        return first, second

    first, (failed, fine) = asyncio.run(main())
    assert [o.reward for o in first] == [1.0, 2.0, 3.0] and guard.batches == [3, 2]
    assert isinstance(failed, RuntimeError) and fine.reward == 2.0  # a broken guard fails its answer, not hangs


def test_the_rollout_timeline_spans_each_weight_swap_itself(mock_worker, tmp_path):
    """The rollout's weight_sync span covers the engine's swap (between engine steps, in the hub),
    not the moment the trainer's push arrived: a timeline shows where generation stopped."""
    from cadence.observe.events import Timeline

    worker = mock_worker(alpha=1)
    worker.timeline = Timeline(tmp_path, "rollout-0")
    swaps, swap = [], worker.engine.update_weights

    def slow_swap(state_dict: dict, version: int) -> None:
        t0 = time.time()
        time.sleep(0.05)
        swap(state_dict, version)
        swaps.append((t0, time.time()))

    worker.engine.update_weights = slow_swap
    _train(worker, range(4))
    worker.get_batch(4)
    worker.timeline.close()
    spans = read_jsonl(tmp_path / "events" / "rollout-0.jsonl")
    synced = [(s["t0"], s["t1"]) for s in spans if s.get("state") == "weight_sync"]
    assert len(synced) == len(swaps) >= 1  # pushes queued before a swap go in as one: the newest
    for (t0, t1), (s0, s1) in zip(synced, swaps, strict=True):
        assert t0 <= s0 + 1e-3 and s1 - 1e-3 <= t1  # spans are written to 0.1 ms
