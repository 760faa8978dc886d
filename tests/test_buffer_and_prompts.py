"""The sample buffer's freshness rule and the resumable prompt stream."""

from __future__ import annotations

import pytest

from cadence.data.tasks import Prompt
from cadence.rollout.buffer import SampleBuffer
from cadence.rollout.prompts import PromptStream
from cadence.rollout.sample import Group, Sample


def group(gid: int, version: int, n: int = 2) -> Group:
    g = Group(group_id=gid, prompt_id=f"p{gid}")
    g.samples = [Sample(f"p{gid}", gid, [1], [2], [-0.1], 1.0, version, "stop") for _ in range(n)]
    return g


def test_sync_buffer_drops_every_older_version():
    buf = SampleBuffer(async_ratio=0)
    buf.put(group(0, version=0))
    buf.put(group(1, version=1))
    out = buf.get_batch(1, trainer_version=1, timeout=0)
    assert [g.group_id for g in out] == [1]
    assert buf.dropped_groups == 1 and buf.dropped_samples == 2


def test_async_ratio_keeps_groups_within_alpha():
    buf = SampleBuffer(async_ratio=2)
    for v in range(5):
        buf.put(group(v, version=v))
    out = buf.get_batch(3, trainer_version=4, timeout=0)
    assert [g.version for g in out] == [2, 3, 4]
    assert all(4 - g.version <= 2 for g in out)
    assert buf.dropped_groups == 2


def test_group_version_is_its_oldest_sample():
    g = group(0, version=3)
    g.samples[1].version = 1
    assert g.version == 1


def test_get_batch_times_out_when_short():
    buf = SampleBuffer(async_ratio=0)
    with pytest.raises(TimeoutError):
        buf.get_batch(1, trainer_version=0, timeout=0.01)


def test_prompt_stream_resumes_exactly():
    prompts = [Prompt(id=str(i), text=f"{i}+0=", answer=str(i), meta={}) for i in range(7)]
    a = PromptStream(prompts, seed=3)
    first = [a.at(i).id for i in range(19)]
    b = PromptStream(prompts, seed=3)
    assert [b.at(i).id for i in range(10, 19)] == first[10:]  # a position's prompt needs no history
    # each epoch is a permutation of all prompts
    assert sorted(first[:7]) == sorted(p.id for p in prompts)


def test_a_drawn_stream_walks_the_tasks_prompts_block_by_block():
    """Given draw(n) (the first n of an endless task stream), block b is the stream's prompts
    b*block .. (b+1)*block-1, each block in its own seeded order: every prompt once per pass."""
    stream_of = [Prompt(id=f"t{i}", text=str(i), answer="") for i in range(40)]
    asked: list[int] = []

    def draw(n: int) -> list[Prompt]:
        asked.append(n)
        return stream_of[:n]

    stream = PromptStream(draw, seed=3, block=10)
    ids = [stream.at(i).id for i in range(30)]
    for b in range(3):  # each block is a permutation of its own slice of the task stream
        assert sorted(ids[10 * b : 10 * b + 10], key=lambda x: int(x[1:])) == [f"t{i}" for i in range(10 * b, 10 * b + 10)]
    assert asked == [10, 20, 30]
    again = PromptStream(draw, seed=3, block=10)
    assert [again.at(i).id for i in range(25, 30)] == ids[25:]  # a resumed stream continues mid-block
