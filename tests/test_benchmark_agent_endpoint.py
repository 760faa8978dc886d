"""benchmarks/agent_endpoint.py: a tiny env-async vs lock-step comparison through the endpoint.

Nothing here is asserted on timing: both modes finish every episode, the lock-step
runs meet at their barrier every turn, and the async runs never do.
"""

from __future__ import annotations

import asyncio

from tests.benchmark_module import load_benchmark


def test_both_modes_finish_every_episode_and_only_lockstep_waits_at_its_barrier():
    bench = load_benchmark("agent_endpoint")
    steps, runs = 2, 4
    # 1/50 of the workload's time: 10 ms steps on average, a 0.2 s step timeout
    result = asyncio.run(bench.env_async_vs_lockstep(steps, runs, scale=0.02))
    sync, free = result["lockstep"], result["async"]
    assert result["errors"] == 0
    assert sync["episodes"] == free["episodes"] == steps * runs
    assert free["turn_waits"] == free["blocked_waits"] == free["rounds"] == 0
    # every attempt (the lost ones too) arrives at the barrier once a turn, and all but
    # the last of a round's runs to arrive block there
    attempts = sync["episodes"] + sync["lost"]
    assert sync["turn_waits"] == bench.ENV_TURNS * attempts
    assert sync["blocked_waits"] == sync["turn_waits"] - bench.ENV_TURNS * sync["rounds"] > 0
    assert sync["rounds"] >= steps
    assert result["ratio"] > 0 and len(sync["step_wall_s"]) == len(free["step_wall_s"]) == steps


def test_a_lost_run_keeps_its_lockstep_slot_until_the_round_ends():
    bench = load_benchmark("agent_endpoint")

    class NeverAnswers(bench.Tool):  # a fail-stop on the first step
        async def step(self, action: str) -> str:
            await asyncio.Event().wait()

    class Client:  # the one call the agent makes
        class chat:  # noqa: N801 (the openai client's attribute names)
            class completions:  # noqa: N801
                @staticmethod
                async def create(**_):
                    message = type("M", (), {"content": "guess 1"})
                    return type("R", (), {"choices": [type("C", (), {"message": message})]})

    async def play() -> tuple[bool, bool, int]:
        barrier = bench.CountingBarrier(2)
        lost, done = await asyncio.gather(bench.agent(Client(), NeverAnswers(), 0, 3, 0.01, barrier),
                                          bench.agent(Client(), bench.Tool(), 1, 3, 0.01, barrier))
        return lost, done, barrier.waits

    assert asyncio.run(play()) == (False, True, 6)
    # without a barrier a lost run returns at once
    assert asyncio.run(bench.agent(Client(), NeverAnswers(), 0, 3, 0.01)) is False
