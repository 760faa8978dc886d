"""The agentic simulation: cadence's episode rollout on virtual time, checked on hand-computable cases."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from cadence.cli import app
from cadence.simulate.config import load_sim_config
from cadence.simulate.sim import simulate
from cadence.simulate.virtual_asyncio import VirtualTimeLoop, VirtualTimeStalled

# A cluster whose GPUs cost (almost) nothing: what is left of a step is the environments' time.
FREE_GPUS = ["gpu.hbm_tb_s=1e9", "gpu.peak_tflops=1e12", "rollout.step_overhead_s=0", "trainer.weight_sync_gb_s=1e12",
             "trainer.colocate_switch_s=0"]
SMALL = ["cluster.gpus=2", "rollout.gpus_per_worker=1", "workload.prompts_per_step=4", "workload.group_size=4",
         "workload.prompt_tokens=64", "workload.median_tokens=64", "workload.max_tokens=256", "run.steps=2",
         "run.warmup_steps=1", "env.turns=3", "env.observation_tokens=32"]
SYNC = ["cluster.alpha=0", "cluster.colocate=true"]


def _run(*overrides: str):
    return simulate(load_sim_config(None, None, [*SMALL, *overrides]))


def test_virtual_loop_sleeps_and_times_out_without_waiting():
    loop = VirtualTimeLoop()

    async def main() -> float:
        await asyncio.sleep(10)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 30)
        return loop.time()

    try:
        assert loop.run_until_complete(main()) == pytest.approx(40.0)
        with pytest.raises(VirtualTimeStalled):
            loop.run_until_complete(asyncio.Event().wait())  # nobody will ever set it
    finally:
        loop.close()


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_constant_latency_makes_a_step_turns_times_latency(mode):
    # 3 turns of 10 s each and free GPUs: every step takes 3 x 10 s, lock-step or not.
    r = _run(*FREE_GPUS, *SYNC, f"env.mode={mode}", "env.latency.mean_s=10")
    assert r.step_s == pytest.approx(30.0, abs=0.05)
    assert [s.samples for s in r.steps] == [16, 16, 16]  # 4 groups x 4 episodes a step
    assert r.counts["turns"] == 3 * 16 * 3


def test_lockstep_waits_for_the_slowest_environment_of_every_turn():
    latency = [*FREE_GPUS, *SYNC, "env.latency.mean_s=10", "env.latency.std_s=10", "run.steps=4"]
    lock, asy = _run(*latency, "env.mode=lockstep"), _run(*latency, "env.mode=async")
    # lock-step: the sum over turns of each turn's slowest step; async: each episode's own sum,
    # and the step waits for the slowest episode. A max of sums is at most the sum of maxes.
    assert lock.step_s > 1.1 * asy.step_s
    assert 30 < asy.step_s < lock.step_s < 3 * 80


def test_zero_latency_one_turn_episodes_take_rlvr_time():
    # One turn without environment time is an RLVR answer: same engines, same lengths, same step.
    rlvr = ["cluster.gpus=2", "rollout.gpus_per_worker=1", "workload.prompts_per_step=4", "workload.group_size=4",
            "workload.prompt_tokens=64", "workload.median_tokens=64", "workload.max_tokens=256",
            "workload.length_dist=fixed", "run.steps=2", "run.warmup_steps=1", *SYNC]
    plain = simulate(load_sim_config(None, None, rlvr))
    agent = simulate(load_sim_config(None, None, [*rlvr, "env.turns=1", "env.observation_tokens=32"]))
    assert agent.step_s == pytest.approx(plain.step_s, rel=0.02)
    assert agent.samples_per_s == pytest.approx(plain.samples_per_s, rel=0.02)


def test_fail_stop_episodes_time_out_and_redundancy_hides_them():
    faults = [*FREE_GPUS, *SYNC, "env.latency.mean_s=1", "env.latency.fail_stop_share=0.1", "env.step_timeout_s=20",
              "run.steps=4"]
    plain = _run(*faults)
    assert plain.counts["lost/timeout"] > 0 and plain.counts["retried"] == plain.counts["lost/timeout"]
    assert all(s.samples == 16 for s in plain.steps)  # lost episodes were replaced: full groups
    spare = _run(*faults, "env.redundancy=2")
    assert spare.counts["cancelled"] > 0  # the slowest episodes of a group were not waited for
    assert spare.step_s < plain.step_s


def test_alpha_bounds_staleness_of_episodes():
    r = _run("cluster.gpus=3", "cluster.train_gpus=1", "cluster.alpha=1", "env.latency.mean_s=5",
             "env.latency.std_s=5", "run.steps=4")
    assert max(s.staleness_mean for s in r.steps) <= 1
    assert r.rollout_gpus == 2 and r.train_gpus == 1


def test_simulate_agentic_prints_the_ladder():
    result = CliRunner().invoke(app, ["simulate", "agentic", *SMALL, "env.min_turns=2", "env.latency.mean_s=2", "cluster.gpus=3",
                                      "--redundancy", "1", "--extra-groups", "0", "--alpha", "1"])
    assert result.exit_code == 0, result.output
    assert "| lock-step sync |" in result.output and "+ async training (alpha 1)" in result.output
    result = CliRunner().invoke(app, ["simulate", "agentic", "env.turnz=3"])
    assert result.exit_code == 2 and "env.turnz: unknown key" in result.output


def test_an_agentic_run_repeats_exactly_and_the_seed_matters():
    noisy = ["env.latency.mean_s=5", "env.latency.std_s=5", *SYNC]
    one = _run(*noisy)
    assert _run(*noisy).step_s == one.step_s  # the latency draws do not depend on earlier runs
    assert _run(*noisy, "run.seed=1").step_s != one.step_s


def test_a_turn_prefills_only_what_its_episode_did_not_cache():
    from cadence.inference.types import GenRequest, SamplingParams
    from cadence.simulate.agentic import PrefixCachingEngine

    engine = PrefixCachingEngine(prefill_latency_s=1.0, length_dist="fixed", median_tokens=2, virtual_clock=True)
    params = SamplingParams(max_new_tokens=8)

    def turn(request_id: str, prompt: int) -> float:
        before = engine.clock()
        engine.add_request(GenRequest(request_id, [1] * prompt, params, cache_key="episode"))
        while engine.has_unfinished():
            engine.step()
        return engine.clock() - before

    assert turn("t0", 10) == 10.0  # nothing cached: the whole first observation
    assert turn("t1", 10 + 2 + 3) == 3.0  # the first turn's 12 tokens are cached; 3 new observation tokens
    engine.forget("episode")
    assert turn("t2", 15) == 15.0
