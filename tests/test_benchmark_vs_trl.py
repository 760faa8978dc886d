"""benchmarks/vs_trl.py: memory sampler, reward wrapper, settings, outputs, and a --quick run."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.benchmark_module import load_benchmark

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "vs_trl.py"
MiB = 2**20


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("vs_trl")


# ----------------------------------------------------------------------------- memory sampler


def test_sampler_sums_the_whole_process_tree(bench, tmp_path):
    # The child holds 100 MiB and starts a grandchild that holds 150 MiB: the tree's
    # peak must see both (bytes multiplication touches every page, unlike bytearray(n)).
    child = textwrap.dedent(
        """
        import subprocess, sys, time
        held = b"a" * (100 << 20)
        grandchild = subprocess.Popen(
            [sys.executable, "-c", "import time; held = b'b' * (150 << 20); time.sleep(2.5)"]
        )
        grandchild.wait()
        """
    )
    run = bench.run_sampled([sys.executable, "-c", child], interval=0.1, pss_every=3)
    assert run.returncode == 0 and not run.timed_out
    assert run.max_processes >= 2
    assert run.peak_rss >= 240 * MiB, run.peak_rss / MiB
    assert run.peak_pss is not None and run.peak_pss >= 200 * MiB
    assert run.wall_s >= 2.0
    times = [s.t for s in run.samples]
    assert times == sorted(times) and run.started <= times[0]
    assert run.peak_rss_between(times[0], times[-1]) == run.peak_rss
    assert run.peak_rss_between(0.0, 1.0) == 0


def test_tree_memory_of_a_gone_process_is_empty(bench):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert bench.tree_memory(proc.pid) == (0, None, 0)


def test_sampler_timeout_kills_the_tree(bench, tmp_path):
    log = tmp_path / "log.txt"
    child = textwrap.dedent(
        """
        import subprocess, sys, time
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(g.pid, flush=True)
        time.sleep(60)
        """
    )
    began = time.perf_counter()
    run = bench.run_sampled([sys.executable, "-c", child], log_path=log, interval=0.1, timeout=2.0)
    assert run.timed_out and time.perf_counter() - began < 20
    grandchild = int(log.read_text().split()[0])
    deadline = time.time() + 5
    while psutil.pid_exists(grandchild) and time.time() < deadline:
        try:
            if psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    alive = psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE
    assert not alive


# ----------------------------------------------------------------------------- shared pieces


def test_trl_reward_agrees_with_cadence_verifier(bench):
    from cadence.config import RunConfig
    from cadence.data.build import build_task
    from cadence.rewards.build import build_reward
    from cadence.rewards.verifiers import ExactMatch

    cfg = RunConfig()
    task = build_task(cfg.task)
    verifier = build_reward(cfg.reward, task)
    assert isinstance(verifier, ExactMatch) and verifier.extract == "first_line"
    reward = bench.make_trl_reward(cfg, task)
    assert reward.__name__ == "cadence_exact_match"  # TRL names its logged metric after it

    prompts = task.prompts("train", 6, 0)
    variants = ["{a}\n", "{a}", " {a} \nnoise", "\n{a}\n", "{a}0\n", "1{a}", "", "7\n{a}"]
    texts, completions, answers, expected = [], [], [], []
    for p in prompts:
        for v in variants:
            texts.append(p.text)
            completions.append(v.format(a=p.answer))
            answers.append(p.answer)
            expected.append(verifier(p, v.format(a=p.answer)))
    got = reward(prompts=texts, completions=completions, answer=answers, completion_ids=None, trainer_state=None)
    assert got == expected
    assert set(got) == {0.0, 1.0}
    assert got[: len(variants)] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_train_prompts_are_cadences_training_prompts(bench):
    from cadence.config import RunConfig
    from cadence.data.build import build_task

    cfg = RunConfig()
    task = build_task(cfg.task)
    prompts = bench.train_prompts(cfg, 3)
    assert len(prompts) == 3 * bench.PROMPTS_PER_STEP
    assert [p.text for p in prompts] == [p.text for p in bench.train_prompts(cfg, 3)]
    pool = {p.text for p in task.prompts("train", 3 * bench.PROMPTS_PER_STEP, bench.SEED)}
    test = {p.text for p in task.prompts("test", bench.TEST_PROMPTS, bench.SEED)}
    assert {p.text for p in prompts} == pool and not pool & test


@pytest.mark.parametrize(("setting", "max_new"), [("arith", 8), ("chain", 352)])
def test_cadence_overrides_validate(bench, tmp_path, setting, max_new):
    from cadence.config import RunConfig, load_config

    s = bench.SETTINGS[setting]
    sync = load_config(None, bench.cadence_overrides("cadence-sync", s, "builtin", 7, str(tmp_path), 2))
    run = load_config(None, bench.cadence_overrides("cadence-async", s, "builtin", 7, str(tmp_path), 2))
    for cfg in (sync, run):
        assert cfg.task.name == setting and cfg.model.path == "builtin"
        assert cfg.batch_size == bench.BATCH == 128
        assert cfg.rollout.group_size == 8 and cfg.rollout.max_new_tokens == max_new
        assert cfg.trainer.steps == 7 and cfg.trainer.lr == RunConfig().trainer.lr
        assert cfg.algorithm.kl.coef == 0 and not cfg.eval.after
    assert (sync.runtime.kind, sync.runtime.threads, sync.rollout.async_ratio) == ("inline", 2, 0)
    assert (run.runtime.kind, run.runtime.threads, run.rollout.async_ratio) == ("ray", 1, 2)
    assert run.runtime.rollout_cpus == 1
    with pytest.raises(ValueError):
        bench.cadence_overrides("trl", s, "builtin", 7, str(tmp_path), 2)


def test_trl_settings_match_cadence(bench):
    from cadence.config import RunConfig

    d = RunConfig()
    s = bench.trl_settings(bench.SETTINGS["arith"], 60, "/tmp/x")
    assert s["per_device_train_batch_size"] * s["gradient_accumulation_steps"] == 128
    assert s["generation_batch_size"] == 128 and s["num_generations"] == d.rollout.group_size == 8
    assert s["num_iterations"] == 1 and s["max_steps"] == 60
    assert s["learning_rate"] == d.trainer.lr and s["beta"] == d.algorithm.kl.coef == 0
    assert s["max_grad_norm"] == d.trainer.grad_clip
    assert (s["epsilon"], s["epsilon_high"]) == (d.algorithm.eps_low, d.algorithm.eps_high)
    assert s["loss_type"] == "dapo" and d.algorithm.aggregation == "token-mean"
    assert s["scale_rewards"] == "group" and d.algorithm.std_normalize
    assert s["logging_steps"] == 1 and s["save_strategy"] == "no" and s["eval_strategy"] == "no"
    assert s["report_to"] == "none" and not s["use_vllm"] and not s["bf16"]
    assert s["max_completion_length"] == 8 and s["use_transformers_continuous_batching"] is False
    assert bench.trl_settings(bench.SETTINGS["arith"], 60, "/tmp/x", continuous=True)[
        "use_transformers_continuous_batching"
    ]
    assert bench.trl_settings(bench.SETTINGS["chain"], 30, "/tmp/x")["max_completion_length"] == 352


def test_chain_setting_gives_trl_cadences_chain_work(bench):
    from cadence.data.chain import chain_answer

    cfg = bench.setting_config(bench.SETTINGS["chain"], "builtin")
    assert cfg.task.name == "chain"
    prompts = bench.train_prompts(cfg, 2)
    assert all(p.text == f"{p.meta['a']:02d}+{p.meta['b']:02d}=" for p in prompts)
    reward = bench.make_trl_reward(cfg)
    worked = [chain_answer(p.meta["a"], p.meta["b"])[0] for p in prompts]
    got = reward(prompts=[p.text for p in prompts], completions=worked, answer=[p.answer for p in prompts])
    assert got == [1.0] * len(prompts)
    assert bench.prepare_model(bench.SETTINGS["arith"]) == "builtin"


def test_trl_settings_build_a_grpo_config(bench, tmp_path):
    import trl  # a test dependency: these tests must not skip for want of it

    args = trl.GRPOConfig(**bench.trl_settings(bench.SETTINGS["arith"], 5, str(tmp_path)))
    assert args.steps_per_generation == 2 and args.generation_batch_size == 128
    assert args.gradient_checkpointing is False and args.bf16 is False


def test_child_env_sets_thread_counts(bench):
    assert bench.child_env("trl", 2)["OMP_NUM_THREADS"] == "2"
    assert bench.child_env("cadence-sync", 2)["MKL_NUM_THREADS"] == "2"
    assert bench.child_env("cadence-async", 2)["OMP_NUM_THREADS"] == "1"
    assert bench.thread_plan("cadence-async", 2)["rollout_actor_torch_threads"] == 1


# ----------------------------------------------------------------------------- outputs


def fake_results(bench) -> dict:
    def run(kind: str, sps: float, rss_mib: float, acc: float) -> dict:
        curve = [{"step": i + 1, "t": (i + 1) * 128 / sps, "reward": 0.7 + 0.1 * i, "tokens": 450.0} for i in range(3)]
        return {
            "run": kind, "setting": "arith", "label": bench.LABELS[kind], "steps": 3, "train_seconds": 384 / sps,
            "total_seconds": 384 / sps + 20, "eval_seconds": 1.0, "samples": 384,
            "completion_tokens": 1350.0, "samples_per_s": sps, "tokens_per_s": sps * 3.5,
            "peak_rss_bytes": int(rss_mib * MiB), "peak_rss_training_bytes": int(rss_mib * MiB),
            "peak_pss_bytes": int(rss_mib * MiB * 0.6), "max_processes": 2, "memory_samples": 10,
            "accuracy": acc, "final_reward": 0.9, "threads": {}, "curve": curve, "settings": {},
        }

    runs = [run("trl", 100.0, 1000, 0.98), run("cadence-sync", 200.0, 800, 0.995), run("cadence-async", 350.0, 2000, 0.97)]
    bench.add_ratios(runs)
    config = {"steps": 3, "prompts_per_step": 16, "group_size": 8, "completions_per_step": 128, "max_new_tokens": 8}
    return {
        "quick": True,
        "machine": {"cpu_count": 2, "cpus_used": 2, "cpu_model": "test cpu", "loadavg_before": [0.1, 0.2, 0.3]},
        "versions": {"trl": "1.16.0", "torch": "2.13.0", "transformers": "5.19.0"},
        "settings": {"arith": {"config": config, "start_accuracy": 0.66, "runs": runs}},
    }


def test_ratios_to_trl(bench):
    runs = fake_results(bench)["settings"]["arith"]["runs"]
    assert runs[0]["ratios_to_trl"]["samples_per_s"] == 1.0
    assert runs[1]["ratios_to_trl"]["samples_per_s"] == pytest.approx(2.0)
    assert runs[2]["ratios_to_trl"]["samples_per_s"] == pytest.approx(3.5)
    assert runs[2]["ratios_to_trl"]["peak_rss"] == pytest.approx(2.0)
    assert runs[2]["ratios_to_trl"]["accuracy_points"] == pytest.approx(-1.0)
    lone = [dict(runs[1])]
    bench.add_ratios(lone)
    assert lone[0]["ratios_to_trl"] is None
    results = fake_results(bench)
    results["settings"]["arith"]["runs"] = lone
    assert "n/a" in bench.markdown_table(results, "arith")


def test_write_outputs(bench, tmp_path):
    results = fake_results(bench)
    start, end = "<!-- vs-trl-arith-table-start -->", "<!-- vs-trl-arith-table-end -->"
    doc = tmp_path / "vs_trl.md"
    doc.write_text(f"# title\n\nbefore\n\n{start}\nold table\n{end}\n\nafter\n")
    paths = (tmp_path / "r" / "vs_trl.json", tmp_path / "r" / "vs_trl.png", doc)
    bench.write_outputs(results, *paths)
    bench.write_outputs(results, *paths)  # a rerun replaces the table, it does not add one

    saved = json.loads(paths[0].read_text())["settings"]["arith"]["runs"]
    assert saved[1]["ratios_to_trl"]["samples_per_s"] == pytest.approx(2.0)
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = doc.read_text()
    assert text.startswith("# title\n\nbefore\n") and text.rstrip().endswith("after")
    assert "old table" not in text and text.count(start) == 1
    table = text.split(start)[1].split(end)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(rows) == 4  # header + 3 runs
    assert "TRL GRPOTrainer" in rows[1] and "1.00x" in rows[1]
    assert "cadence sync" in rows[2] and "2.00x" in rows[2] and "0.80x" in rows[2] and "+1.5 pts" in rows[2]
    assert "cadence async" in rows[3] and "3.50x" in rows[3] and "-1.0 pts" in rows[3]
    assert "1000 MiB" in rows[1] and "trl 1.16.0" in table and "0.660" in table and "`arith`" in table

    fresh = tmp_path / "fresh.md"  # no doc yet: written with just the markers and the table
    bench.write_outputs(results, *paths[:2], fresh)
    assert fresh.read_text().lstrip().startswith(start)

    # Two settings: a table each between its own markers, a panel each in one plot.
    from PIL import Image

    one_panel = Image.open(paths[1]).size[0]
    chain = copy.deepcopy(results["settings"]["arith"])
    chain["config"]["max_new_tokens"] = 352
    results["settings"]["chain"] = chain
    bench.write_outputs(results, *paths)
    text = doc.read_text()
    assert text.count(start) == 1 and text.count("<!-- vs-trl-chain-table-start -->") == 1
    assert "Setting `arith`" in text and "Setting `chain`" in text
    assert json.loads(paths[0].read_text())["settings"]["chain"]["config"]["max_new_tokens"] == 352
    assert Image.open(paths[1]).size[0] > one_panel


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path):
    def stamps() -> dict:  # this benchmark's files under docs/ (others may edit the rest)
        ours = [ROOT / "docs" / "vs_trl.md", *(ROOT / "docs" / "results").glob("vs_trl*")]
        return {p: p.stat().st_mtime_ns for p in ours if p.exists()}

    before = stamps()
    out = tmp_path / "out"
    # One setting end to end: chain, the one with a warm-up SFT to make and long answers (arith's
    # start model is the built-in one). Two settings in one report: test_write_outputs.
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--steps", "2", "--settings", "chain", "--out", str(out)],
        capture_output=True, text=True, timeout=1500, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "vs_trl.json").read_text())
    assert list(results["settings"]) == ["chain"]
    chain = results["settings"]["chain"]
    assert [r["run"] for r in chain["runs"]] == ["trl", "cadence-sync", "cadence-async"]
    for r in chain["runs"]:
        assert r["steps"] == 2 and r["samples"] == 2 * 128 and len(r["curve"]) == 2
        assert 0.0 <= r["accuracy"] <= 1.0 and r["samples_per_s"] > 0 and r["tokens_per_s"] > 0
        assert r["peak_rss_bytes"] > 100 * MiB and r["total_seconds"] >= r["train_seconds"]
        assert r["ratios_to_trl"]["samples_per_s"] > 0
    assert chain["runs"][2]["max_processes"] > 2  # Ray's processes are in the tree
    assert results["versions"]["trl"] and results["machine"]["cpus_used"] == 2
    assert not chain["runs"][0]["settings"]["vllm_imported"]
    assert chain["config"]["max_new_tokens"] == 352 and "runs/bench-vs-trl" not in chain["config"]["model"]
    assert (out / "vs_trl.png").read_bytes()[:4] == b"\x89PNG"
    doc = (out / "vs_trl.md").read_text()
    assert "TRL GRPOTrainer" in doc and "Setting `chain`" in doc
    assert stamps() == before, "--quick wrote under docs/"
