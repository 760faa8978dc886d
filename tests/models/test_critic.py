"""ValueModel critics on tiny Llama / Qwen2 checkpoints, and the small-critic config."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from cadence.models.critic import ValueModel, small_critic_config
from cadence.models.tiny import tiny_config, tiny_model


@pytest.fixture(params=["llama", "qwen2"])
def ckpt(request, tiny_llama_dir, tiny_qwen2_dir) -> str:
    return {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}[request.param]


def _batch(vocab: int = 260, b: int = 3, n: int = 9, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (b, n), generator=gen)
    mask = torch.ones(b, n, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    return ids, mask


def test_from_pretrained_loads_backbone_and_gives_values_per_position(ckpt):
    critic = ValueModel.from_pretrained(ckpt).eval()
    lm = AutoModelForCausalLM.from_pretrained(ckpt)
    for name, p in critic.backbone.state_dict().items():
        assert torch.equal(p, lm.model.state_dict()[name]), name
    ids, mask = _batch()
    with torch.no_grad():
        values = critic(ids, mask)
    assert values.shape == ids.shape and values.dtype == torch.float32
    assert torch.isfinite(values).all()
    assert (
        critic.num_parameters()
        == sum(p.numel() for p in lm.model.parameters()) + critic.config.hidden_size + 1
    )


def test_left_padding_does_not_change_values(tiny_llama_dir):
    critic = ValueModel.from_pretrained(tiny_llama_dir).eval()
    ids = _batch()[0][:1, :6]
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    pad_mask = torch.cat(
        [torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)], 1
    )
    with torch.no_grad():
        plain = critic(ids, torch.ones_like(ids))
        shifted = critic(padded, pad_mask)[:, 3:]
    assert torch.allclose(plain, shifted, atol=1e-5)


def test_critic_trains_toward_a_fixed_target(ckpt):
    torch.manual_seed(0)
    critic = ValueModel.from_pretrained(ckpt).train()
    ids, mask = _batch()
    target = torch.linspace(-1, 1, ids.shape[1]).expand_as(ids)
    opt = torch.optim.SGD(critic.parameters(), lr=0.05)
    losses = []
    for _ in range(8):
        loss = 0.5 * (((critic(ids, mask) - target) ** 2) * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


def test_save_and_load_round_trip(ckpt, tmp_path):
    torch.manual_seed(1)
    critic = ValueModel.from_pretrained(ckpt).eval()
    with torch.no_grad():
        critic.value_head.weight.normal_()  # make the head distinguishable from a fresh init
        critic.value_head.bias.fill_(0.3)
    critic.save_pretrained(str(tmp_path / "critic"))
    back = ValueModel.load(str(tmp_path / "critic")).eval()
    ids, mask = _batch()
    with torch.no_grad():
        assert torch.equal(critic(ids, mask), back(ids, mask))
    for (n1, p1), (n2, p2) in zip(
        critic.state_dict().items(), back.state_dict().items(), strict=True
    ):
        assert n1 == n2 and torch.equal(p1, p2), n1


def test_load_refuses_a_plain_checkpoint(tiny_llama_dir):
    with pytest.raises(FileNotFoundError, match="from_pretrained"):
        ValueModel.load(tiny_llama_dir)


@pytest.mark.parametrize(
    "arch,hidden,layers,kv_heads",
    [("llama", 64, 2, None), ("qwen2", 64, 2, None), ("llama", 128, 4, 2), ("qwen2", 128, 6, 1)],
)
def test_small_critic_config_is_a_quarter_of_the_policy(arch, hidden, layers, kv_heads):
    policy_config = tiny_config(arch, hidden_size=hidden, layers=layers, kv_heads=kv_heads)
    config = small_critic_config(policy_config, max_fraction=0.25)
    assert type(config) is type(policy_config) and config.vocab_size == policy_config.vocab_size
    policy = tiny_model(arch, hidden_size=hidden, layers=layers, kv_heads=kv_heads)
    critic = ValueModel.from_config(config)
    fraction = critic.num_parameters() / sum(p.numel() for p in policy.parameters())
    assert 0.05 < fraction <= 0.25
    assert config.num_attention_heads % config.num_key_value_heads == 0
    ids, mask = _batch()
    assert critic(ids, mask).shape == ids.shape  # the shrunk shape is a working model


def test_small_critic_config_from_path_and_impossible_budget(tiny_qwen2_dir):
    config = small_critic_config(tiny_qwen2_dir, max_fraction=0.5)
    assert config.model_type == "qwen2"
    with pytest.raises(ValueError, match="critic_fraction"):
        small_critic_config(tiny_qwen2_dir, max_fraction=0.001)
