"""What the agent endpoint adds per turn, and whether it holds 256 agent runs at once.

    python benchmarks/agent_endpoint.py                # ~10 min; writes docs/results/agent_endpoint.json
    python benchmarks/agent_endpoint.py --quick        # smoke: fewer turns, runs and steps, writes nothing

On the mock engine (no model: a turn costs only what the path around it costs),
over one InferenceHub served on this loop, with the AgentEndpoint on
127.0.0.1 as a task on the same loop:

  added latency   one agent, turn after turn, alternating: in-process
                  `await hub.generate(GenRequest)` on pre-rendered ids, then the same
                  conversation as a chat request over HTTP, by the `openai.AsyncOpenAI`
                  client (what agents use) and by a bare httpx client (the server's
                  share). Added latency = HTTP turn - in-process turn, p50 and p99.
  concurrency     256 agent runs at once, each its own key and client, 4 chat turns
                  each; errors counted, turns/s and per-turn latency.
  env async       env-level async vs lock-step through the endpoint, on benchmarks/env_async.py's
                  simulated-latency workload (env_async_sim.yaml, ROLL Flash's test): an
                  `openai`-only agent plays 12 turns, each a chat turn and then an environment
                  step that waits max(0, N(0.5 s, 0.5 s)), 5% of steps 10x (fail-slow), 1% never
                  (fail-stop: lost at the 10 s step timeout, replayed on the same seed). The mock
                  engine costs what a GPU would (20 ms a decode step + 0.05 ms a running row).
                  A step is 64 runs. async: every run its own coroutine, no barrier, a lost run
                  replays at once; lock-step: the step's runs share an asyncio.Barrier per turn,
                  lost runs replay together after the round. The same episodes (seeds and latency
                  draws) in both; steps alternate between the two, so both see the same load.
                  --time-scale shortens every latency, the timeout and the decode cost; below 1
                  the agents' HTTP CPU (~8 ms a turn) starts to weigh on the async runs of a
                  loaded machine (0.2: 1.92x under load 18, where 1.0 gave 3.13x).

The machine's load average is recorded beside the numbers: other jobs on
these 2 cores add to every percentile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import ssl
import sys
import time
from pathlib import Path

import httpx
import openai

from cadence.agents import AgentEndpoint
from cadence.envs.latency import with_latency
from cadence.inference.hub import InferenceHub
from cadence.inference.mock import MockEngine
from cadence.inference.types import GenRequest, SamplingParams
from cadence.models.tiny import char_tokenizer

COMMAND = "python benchmarks/agent_endpoint.py"
OUT = Path("docs/results/agent_endpoint.json")
TEMPLATE = (  # Qwen2-style turns
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
REPLY_TOKENS = 16


def chat_tokenizer():
    tok = char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = TEMPLATE
    return tok


class TimedApp:
    """The endpoint's ASGI app, timed from a request's arrival to its last byte out."""

    def __init__(self, app) -> None:
        self.app = app
        self.times: list[float] = []

    async def __call__(self, scope, receive, send) -> None:
        start = time.perf_counter()
        await self.app(scope, receive, send)
        self.times.append(time.perf_counter() - start)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def conversation(turn: int) -> list[dict]:
    """The messages of an agent at `turn`: a question, then replies and follow-ups."""
    messages = [{"role": "user", "content": "What is 17 times 23? Think step by step."}]
    for i in range(turn):
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"and then {i}?"}]
    return messages


async def added_latency(endpoint: AgentEndpoint, hub: InferenceHub, tok, turns: int) -> dict:
    """One agent at a time, 8 turns per run (so each run's trajectory stays agent-sized)."""
    bare = httpx.AsyncClient(base_url=endpoint.base_url)
    client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key="-", max_retries=0, http_client=bare)
    params = SamplingParams(max_new_tokens=REPLY_TOKENS)
    times: dict[str, list[float]] = {"in_process": [], "openai": [], "httpx": []}
    cpu = dict.fromkeys(times, 0.0)  # process CPU seconds: what the path costs, whatever the load
    run = ""
    for turn in range(turns):
        if turn % 8 == 0:
            if run:
                endpoint.close_run(run)
            run = endpoint.open_run()
            client.api_key = run
            bare.headers["authorization"] = f"Bearer {run}"
        messages = conversation(turn % 8)
        ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                         add_special_tokens=False)
        body = {"model": "cadence", "messages": messages, "max_tokens": REPLY_TOKENS}
        calls = {
            "in_process": hub.generate(GenRequest(f"direct-{turn}", ids, params)),
            "openai": client.chat.completions.create(**body),
            "httpx": bare.post("/chat/completions", json=body),
        }
        for name, call in calls.items():  # awaited one after the other, in this order
            start, start_cpu = time.perf_counter(), time.process_time()
            await call
            times[name].append(time.perf_counter() - start)
            cpu[name] += time.process_time() - start_cpu
    await bare.aclose()
    endpoint.close_run(run)
    times["server"] = endpoint.app.times[-len(times["httpx"]) * 2:]  # the HTTP turns' time in the app
    warm = {k: v[len(v) // 10:] for k, v in times.items()}  # the first tenth warms caches up
    out = {f"{k}_ms": {"p50": pct(v, 50) * 1e3, "p99": pct(v, 99) * 1e3} for k, v in warm.items()}
    for client_name in ("openai", "httpx"):
        out[f"added_{client_name}_ms"] = {q: out[f"{client_name}_ms"][q] - out["in_process_ms"][q]
                                          for q in ("p50", "p99")}
    out["added_server_ms"] = {q: out["server_ms"][q] - out["in_process_ms"][q] for q in ("p50", "p99")}
    out["cpu_ms_per_turn"] = {k: v / turns * 1e3 for k, v in cpu.items()}
    out["turns"] = len(warm["in_process"])
    return out


async def concurrent_runs(endpoint: AgentEndpoint, runs: int, turns: int) -> dict:
    """`runs` agents at once, each with its own key and client, as AgentProducer makes them."""
    tls = ssl.create_default_context()  # shared: loading it per client costs ~100 ms of CPU
    latencies: list[float] = []
    errors: list[str] = []
    samples = 0

    async def agent() -> None:
        nonlocal samples
        run = endpoint.open_run()
        http = httpx.AsyncClient(verify=tls, timeout=120)
        client = openai.AsyncOpenAI(base_url=endpoint.run_url(run), api_key=run, max_retries=0, http_client=http)
        messages = [{"role": "user", "content": "What is 17 times 23?"}]
        try:
            for turn in range(turns):
                start = time.perf_counter()
                reply = await client.chat.completions.create(model="cadence", messages=messages,
                                                             max_tokens=REPLY_TOKENS)
                latencies.append(time.perf_counter() - start)
                messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                             {"role": "user", "content": f"and then {turn}?"}]
        except Exception as e:  # counted: the claim is that there are none
            errors.append(f"{type(e).__name__}: {e} (cause: {e.__cause__!r})")
        finally:
            await http.aclose()
            samples += len(endpoint.close_run(run).samples(0.0, 0, "bench"))

    start = time.perf_counter()
    await asyncio.gather(*(agent() for _ in range(runs)))
    wall = time.perf_counter() - start
    return {"runs": runs, "turns_per_run": turns, "errors": len(errors), "first_errors": errors[:3],
            "wall_s": wall, "turns_per_s": len(latencies) / wall, "samples": samples,
            "turn_ms": {"p50": pct(latencies, 50) * 1e3, "p99": pct(latencies, 99) * 1e3}}


# The simulated-latency workload of benchmarks/env_async.py (env_async_sim.yaml): seconds at time scale 1.
LATENCY = {"mean_s": 0.5, "std_s": 0.5, "fail_slow_share": 0.05, "fail_slow_factor": 10, "fail_stop_share": 0.01}
STEP_TIMEOUT_S, ENV_TURNS, ENV_REPLY_TOKENS = 10.0, 12, 8
DECODE_STEP_S, DECODE_ROW_S = 0.02, 0.00005  # the mock engine's GPU-like decode cost in env_async.py


class Tool:
    """The environment behind the latency: its answers do not matter, its waits do."""

    async def reset(self, seed: int) -> str:
        return f"Episode {seed}: find the number."

    async def step(self, action: str) -> str:
        return f"tool: {len(action)} chars"


class CountingBarrier(asyncio.Barrier):
    """A barrier that counts its waits, and the waits that had to block (all but the last to arrive)."""

    def __init__(self, parties: int) -> None:
        super().__init__(parties)
        self.waits = self.blocked = 0

    async def wait(self) -> int:
        self.waits += 1
        self.blocked += self.n_waiting < self.parties - 1
        return await super().wait()


async def agent(client: openai.AsyncOpenAI, env, seed: int, turns: int, step_timeout_s: float,
                barrier: asyncio.Barrier | None = None) -> bool:
    """An agent that knows only the `openai` client: a chat turn, then an environment step, `turns` times.

    False when a step never answered (fail-stop). Under lock-step (`barrier`) every turn ends at the
    barrier, and a lost run keeps arriving there until its round ends, as its empty slot would.
    """
    messages = [{"role": "user", "content": await env.reset(seed)}]
    alive = True
    for _ in range(turns):
        if alive:
            reply = await client.chat.completions.create(model="cadence", messages=messages,
                                                         max_tokens=ENV_REPLY_TOKENS)
            action = reply.choices[0].message.content
            try:
                result = await asyncio.wait_for(env.step(action), step_timeout_s)
                messages += [{"role": "assistant", "content": action}, {"role": "user", "content": result}]
            except TimeoutError:
                alive = False
        if barrier is None and not alive:
            return False
        if barrier is not None:
            await barrier.wait()
    return alive


async def play_step(endpoint: AgentEndpoint, tls: ssl.SSLContext, seeds: list[int], scale: float,
                    lockstep: bool) -> dict:
    """One step's episodes, each played until it completes; lost runs replay on the same seed."""
    latency = {k: v * scale if k.endswith("_s") else v for k, v in LATENCY.items()}
    timeout_s = STEP_TIMEOUT_S * scale
    counts = {"episodes": 0, "lost": 0, "turn_waits": 0, "blocked_waits": 0, "rounds": 0}

    async def attempt(seed: int, tries: int, barrier: CountingBarrier | None) -> bool:
        run = endpoint.open_run()
        http = httpx.AsyncClient(verify=tls, timeout=120)
        client = openai.AsyncOpenAI(base_url=endpoint.run_url(run), api_key=run, max_retries=0, http_client=http)
        env = with_latency(Tool(), **latency, seed=0, instance=(tries,))  # same draws in both modes
        try:
            done = await agent(client, env, seed, ENV_TURNS, timeout_s, barrier)
        finally:
            await http.aclose()
            endpoint.close_run(run)
        counts["episodes" if done else "lost"] += 1
        return done

    async def until_done(seed: int) -> None:  # env-level async: a lost run replays at once
        tries = 0
        while not await attempt(seed, tries, None):
            tries += 1

    start, start_cpu = time.perf_counter(), time.process_time()
    if lockstep:
        pending, tries = seeds, 0
        while pending:  # a round: the pending runs advance turn by turn together
            barrier = CountingBarrier(len(pending))
            done = await asyncio.gather(*(attempt(seed, tries, barrier) for seed in pending))
            counts["turn_waits"] += barrier.waits
            counts["blocked_waits"] += barrier.blocked
            counts["rounds"] += 1
            pending, tries = [s for s, ok in zip(pending, done, strict=True) if not ok], tries + 1
    else:
        await asyncio.gather(*(until_done(seed) for seed in seeds))
    # CPU seconds of this process (both ends of every request): near the wall time, the step was CPU-bound
    return {**counts, "wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - start_cpu}


async def env_async_vs_lockstep(steps: int, runs_per_step: int, scale: float) -> dict:
    """Both modes through one endpoint, step by step alternating (async first on even steps)."""
    tok = chat_tokenizer()
    engine = MockEngine(max_batch_size=max(64, runs_per_step), length_dist="fixed", median_tokens=ENV_REPLY_TOKENS,
                        vocab_size=len(tok), eos_id=tok.eos_token_id, answer_fn=lambda req: "guess 42",
                        step_latency_s=DECODE_STEP_S * scale, per_token_latency_s=DECODE_ROW_S * scale)
    hub = InferenceHub([engine])
    endpoint = AgentEndpoint(hub, tok)
    tls = ssl.create_default_context()
    modes = {"async": [], "lockstep": []}

    async def alternate() -> None:
        await endpoint.start()
        try:
            for step in range(steps):
                seeds = list(range(step * runs_per_step, (step + 1) * runs_per_step))
                order = ("async", "lockstep") if step % 2 == 0 else ("lockstep", "async")
                for mode in order:
                    modes[mode].append(await play_step(endpoint, tls, seeds, scale, mode == "lockstep"))
        finally:
            await endpoint.stop()

    load_before = os.getloadavg()
    await hub.serving(alternate())
    out: dict = {"steps": steps, "runs_per_step": runs_per_step, "turns": ENV_TURNS, "time_scale": scale,
                 "latency": {k: v * scale if k.endswith("_s") else v for k, v in LATENCY.items()},
                 "step_timeout_s": STEP_TIMEOUT_S * scale,
                 "engine": f"MockEngine, fixed {ENV_REPLY_TOKENS}-token replies, {DECODE_STEP_S * scale * 1e3:g} ms "
                           f"a decode step + {DECODE_ROW_S * scale * 1e3:g} ms a running row"}
    for mode, per_step in modes.items():
        total = {k: sum(s[k] for s in per_step) for k in per_step[0]}
        out[mode] = {**total, "episodes_per_s": total["episodes"] / total["wall_s"],
                     "step_wall_s": [s["wall_s"] for s in per_step]}
    out["ratio"] = out["async"]["episodes_per_s"] / out["lockstep"]["episodes_per_s"]
    out["load_average_1_5_15"] = {"before": load_before, "after": os.getloadavg()}
    out["errors"] = endpoint.metrics()["agent/errors"]
    return out


async def measure(turns: int, runs: int, turns_per_run: int) -> dict:
    tok = chat_tokenizer()
    engine = MockEngine(max_batch_size=max(64, runs), length_dist="fixed", median_tokens=REPLY_TOKENS,
                        vocab_size=len(tok), eos_id=tok.eos_token_id, answer_fn=lambda req: "ok")
    hub = InferenceHub([engine])
    endpoint = AgentEndpoint(hub, tok)
    endpoint.app = TimedApp(endpoint.app)

    async def both() -> dict:
        await endpoint.start()
        try:
            return {"added_latency": await added_latency(endpoint, hub, tok, turns),
                    "concurrency": await concurrent_runs(endpoint, runs, turns_per_run),
                    "endpoint_metrics": endpoint.metrics()}
        finally:
            await endpoint.stop()

    return await hub.serving(both())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=1000, help="turns of the added-latency agent")
    parser.add_argument("--runs", type=int, default=256, help="concurrent agent runs")
    parser.add_argument("--turns-per-run", type=int, default=4)
    parser.add_argument("--env-steps", type=int, default=2, help="steps of each mode in the env-async section")
    parser.add_argument("--env-runs", type=int, default=64, help="agent runs a step in the env-async section")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="env_async.py's latencies, timeout and decode cost times this")
    parser.add_argument("--quick", action="store_true", help="100 turns, 32 runs, 2 env steps of 16 at time scale 0.2, nothing written")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        args.turns, args.runs, args.env_steps, args.env_runs, args.time_scale = 100, 32, 2, 16, 0.2
    load_before = os.getloadavg()
    result = asyncio.run(measure(args.turns, args.runs, args.turns_per_run))
    result["env_async"] = asyncio.run(env_async_vs_lockstep(args.env_steps, args.env_runs, args.time_scale))
    result.update({
        "command": " ".join([COMMAND, shlex.join(sys.argv[1:])]).strip(),
        "engine": f"MockEngine, fixed {REPLY_TOKENS}-token replies, no simulated latency",
        "cpus": os.cpu_count(),
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()},
    })
    added, conc = result["added_latency"], result["concurrency"]
    print(f"in-process hub.generate  p50 {added['in_process_ms']['p50']:.2f} ms  p99 {added['in_process_ms']['p99']:.2f} ms")
    print(f"in the endpoint's app (server side)  p50 {added['server_ms']['p50']:.2f} ms  p99 {added['server_ms']['p99']:.2f} ms")
    for name in ("openai", "httpx"):
        print(f"HTTP ({name:6s})  turn p50 {added[name + '_ms']['p50']:.2f} ms  p99 {added[name + '_ms']['p99']:.2f} ms"
              f"  added p50 {added['added_' + name + '_ms']['p50']:.2f} ms  p99 {added['added_' + name + '_ms']['p99']:.2f} ms")
    print("CPU ms per turn: " + ", ".join(f"{k} {v:.2f}" for k, v in added["cpu_ms_per_turn"].items()))
    print(f"{conc['runs']} concurrent runs x {conc['turns_per_run']} turns: {conc['errors']} errors, "
          f"{conc['turns_per_s']:.0f} turns/s, turn p50 {conc['turn_ms']['p50']:.1f} ms p99 {conc['turn_ms']['p99']:.1f} ms")
    env = result["env_async"]
    for mode in ("async", "lockstep"):
        m = env[mode]
        print(f"env {mode:8s}: {m['episodes']} episodes ({m['lost']} lost and replayed) in {m['wall_s']:.1f} s, "
              f"{m['episodes_per_s']:.2f} episodes/s, CPU {m['cpu_s']:.1f} s, barrier waits {m['turn_waits']} ({m['blocked_waits']} blocked)")
    print(f"env-level async / lock-step through the endpoint: {env['ratio']:.2f}x, {env['errors']:.0f} errors, "
          f"load {env['load_average_1_5_15']['before']} -> {env['load_average_1_5_15']['after']}")
    print(f"load average (1, 5, 15 min) before {load_before}, after {result['load_average_1_5_15']['after']}")
    if not args.quick:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
