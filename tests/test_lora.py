"""LoRA (model.lora) and activation checkpointing (trainer.gradient_checkpointing) in the trainer.

Tiny models in this process: what trains, what the KL reference is, what a weight
sync hands the engine, what a checkpoint holds and what export writes.
"""

from __future__ import annotations

import copy

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from cadence.algo.config import AlgorithmConfig
from cadence.config import ConfigError, load_config
from cadence.inference.embedded import EmbeddedEngine
from cadence.inference.types import GenRequest, SamplingParams
from cadence.models.config import LoraConfig
from cadence.models.critic import ValueModel, small_critic_config
from cadence.models.loading import enable_activation_checkpointing, load_policy
from cadence.models.lora import with_lora
from cadence.models.tiny import char_tokenizer, tiny_model
from cadence.rollout.sample import Group, Sample
from cadence.train.batch import collate, flatten
from cadence.train.checkpoint import save_checkpoint
from cadence.train.config import TrainerConfig
from cadence.train.export import export_merged
from cadence.train.logprobs import batched_logprobs, forward_logits, token_logprobs
from cadence.train.trainer import PolicyTrainer

LORA = LoraConfig(r=4, alpha=8.0)


def groups() -> list[Group]:
    """Two prompts, two responses each, one rewarded per group."""
    out = []
    for gid, prompt in enumerate([[40, 41, 42, 43], [50, 51, 52]]):
        g = Group(group_id=gid, prompt_id=str(gid))
        for j, (resp, reward) in enumerate([([60, 61, 62, 63], 1.0), ([70, 71], 0.0)]):
            g.samples.append(Sample(str(gid), gid, prompt, resp, [-1.0] * len(resp), reward, 0, "stop", f"r{j}"))
        out.append(g)
    return out


def lora_trainer(seed: int = 0, kl: float = 0.0, lr: float = 5e-2, **trainer) -> PolicyTrainer:
    policy = with_lora(tiny_model("qwen2", seed=seed, hidden_size=32, layers=2, heads=2), LORA, seed=seed)
    algo = AlgorithmConfig.model_validate({"kl": {"coef": kl}})
    return PolicyTrainer(policy, TrainerConfig(lr=lr, micro_batch_size=4, **trainer), algo, 1.0, pad_id=0)


def logprobs(model, batch) -> torch.Tensor:
    was_training = model.training
    out = batched_logprobs(model.eval(), batch.input_ids, batch.attention_mask, 1.0, micro=8)
    model.train(was_training)
    return out


def test_a_given_lora_field_turns_it_on_and_data_parallel_is_refused():
    assert not load_config(None, []).model.lora.enabled
    assert load_config(None, ["model.lora.r=8"]).model.lora.enabled
    assert not load_config(None, ["model.lora.r=8", "model.lora.enabled=false"]).model.lora.enabled
    with pytest.raises(ConfigError, match="model.lora with runtime.trainer_workers > 1") as err:
        load_config(None, ["model.lora.r=8", "runtime.trainer_workers=2"])
    assert "runtime.trainer_workers=1" in str(err.value)


def test_only_adapters_train_and_the_base_model_is_the_kl_reference():
    trainer = lora_trainer(kl=0.1)
    start = tiny_model("qwen2", seed=0, hidden_size=32, layers=2, heads=2)
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in trainer.model.parameters() if p.requires_grad}
    assert trainer.reference is trainer.model  # no second copy of the model

    base_before = {k: v.clone() for k, v in trainer.model.get_base_model().state_dict().items() if "lora_" not in k}
    for _ in range(3):
        metrics = trainer.step(groups())
    assert metrics["train/kl_ref"] > 0  # the policy moved away from its reference
    base_after = trainer.model.get_base_model().state_dict()
    assert all(torch.equal(v, base_after[k]) for k, v in base_before.items())
    batch = collate(flatten(groups()), 0)
    reference = trainer._ref_logprobs(batch)
    torch.testing.assert_close(reference, logprobs(start, batch), rtol=0, atol=1e-6)
    assert not torch.allclose(logprobs(trainer.model, batch), reference, atol=1e-3)
    assert trainer.model.training  # the reference pass put it back in train mode


def test_merged_weights_are_pefts_merge_under_plain_names_and_leave_the_model_unmerged():
    trainer = lora_trainer()
    trainer.step(groups())
    merged = trainer.weights()
    plain = copy.deepcopy(trainer.model).merge_and_unload()
    assert merged.keys() == plain.state_dict().keys()
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(merged[key], value, rtol=0, atol=1e-6)
    assert any(not torch.equal(merged[k], v) for k, v in tiny_model("qwen2", hidden_size=32, layers=2,
                                                                    heads=2).state_dict().items())
    assert "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight" in trainer.model.state_dict()


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens by full forwards (no cache): what the model itself prefers."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_the_engine_samples_the_merged_policy_after_a_sync():
    trainer = lora_trainer()
    tok = char_tokenizer()
    engine = EmbeddedEngine(tiny_model("qwen2", seed=7, hidden_size=32, layers=2, heads=2), tok, seed=0)
    engine.update_weights(trainer.weights(), 0)  # strict: the plain model's names, every one
    prompt = [40, 41, 42, 43]

    def sample() -> list[int]:
        params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
        return engine.generate([GenRequest("r", prompt, params)])[0].token_ids

    before = sample()
    for _ in range(4):
        trainer.step(groups())
    engine.update_weights(trainer.weights(), trainer.version)
    after = sample()
    assert after != before
    assert after == greedy(copy.deepcopy(trainer.model).merge_and_unload().eval(), prompt, 8)


def test_a_lora_checkpoint_loads_with_peft_and_exports_plain_weights(tmp_path):
    trainer = lora_trainer()
    trainer.step(groups())
    base_dir = tmp_path / "base"
    tiny_model("qwen2", hidden_size=32, layers=2, heads=2).save_pretrained(base_dir)
    trainer.model.peft_config["default"].base_model_name_or_path = str(base_dir)
    folder = save_checkpoint(tmp_path / "run", 1, trainer.model, char_tokenizer(), trainer.state_dict(), keep=1)
    assert (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
    assert not (folder / "model.safetensors").exists()  # the adapter only

    batch = collate(flatten(groups()), 0)
    expected = logprobs(trainer.model, batch)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    torch.testing.assert_close(logprobs(PeftModel.from_pretrained(base, folder), batch), expected)
    torch.testing.assert_close(logprobs(load_policy(str(folder)), batch), expected)  # cadence eval's path

    export_merged(tmp_path / "run", tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert not isinstance(exported, PeftModel)
    torch.testing.assert_close(logprobs(exported, batch), expected)
    with pytest.raises(ValueError, match="not empty"):
        export_merged(tmp_path / "run", tmp_path / "hf")


def test_resume_restores_the_adapters_and_continues_exactly():
    trainer = lora_trainer()
    trainer.step(groups())
    state = copy.deepcopy(trainer.state_dict())
    resumed = lora_trainer(seed=1)  # other adapters (and base) until the state loads
    resumed.model.load_state_dict(trainer.model.state_dict())  # the base comes from the checkpoint's run
    for p in resumed.model.parameters():
        if p.requires_grad:
            p.data.normal_()
    resumed.load_state_dict(state)
    torch.manual_seed(0)
    a = trainer.step(groups())
    torch.manual_seed(0)
    b = resumed.step(groups())
    assert a["train/loss"] == b["train/loss"]
    for (name, x), y in zip(trainer.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), name


def loss_and_grads(model: torch.nn.Module, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.train().zero_grad(set_to_none=True)
    logp = token_logprobs(forward_logits(model, batch.input_ids, batch.attention_mask), batch.input_ids, 1.0)
    loss = -(logp * batch.mask).sum() / batch.mask.sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [False, True])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(lora):
    model = tiny_model("qwen2", hidden_size=32, layers=2, heads=2)
    if lora:
        model = with_lora(model, LoraConfig(r=4, dropout=0.0))
        with torch.no_grad():  # B = 0 would make A's gradient zero on both sides
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
    batch = collate(flatten(groups()), 0)
    loss, grads = loss_and_grads(model, batch)
    checkpointed = copy.deepcopy(model)
    enable_activation_checkpointing(checkpointed)
    assert checkpointed.is_gradient_checkpointing
    loss_ckpt, grads_ckpt = loss_and_grads(checkpointed, batch)
    torch.testing.assert_close(loss_ckpt, loss, rtol=0, atol=1e-6)
    assert grads_ckpt.keys() == grads.keys() and grads  # LoRA: the adapters' gradients, and only theirs
    for name, g in grads.items():
        torch.testing.assert_close(grads_ckpt[name], g, rtol=1e-5, atol=1e-7)


def test_critics_checkpoint_their_activations_with_the_same_gradients():
    torch.manual_seed(0)
    critic = ValueModel.from_config(small_critic_config(tiny_model("qwen2", hidden_size=32, layers=2, heads=2).config, 0.5))
    batch = collate(flatten(groups()), 0)

    def grads(model: ValueModel) -> dict[str, torch.Tensor]:
        model.train().zero_grad(set_to_none=True)
        model(batch.input_ids, batch.attention_mask).pow(2).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    expected = grads(critic)
    enable_activation_checkpointing(critic.backbone)
    assert critic.backbone.is_gradient_checkpointing
    for name, g in grads(critic).items():
        torch.testing.assert_close(g, expected[name], rtol=1e-5, atol=1e-7)
