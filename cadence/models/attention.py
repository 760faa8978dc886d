"""actor_attn: an eager-attention copy of the policy that reads its own attention maps.

Attention-rhythm credit (SPEC section 3, `cadence.algo.rhythm`) needs the
softmax attention maps of a few middle layers over prompt + response. Fused
kernels (SDPA, flash) never materialise them, so we keep a separate eval copy
of the policy with `attn_implementation="eager"`, sync its weights from the
trainer like the inference engine's, and run it once over each batch of
generated samples (`token_credit_padded`).

Memory stays bounded for long sequences:
- `output_attentions=True` in transformers 5 records the maps of *every* layer
  (L x [B, H, N, N]). We instead hook the `self_attn` modules of the selected
  layers only; an eager layer still builds its map transiently, but only the
  selected ones are kept.
- The forward stops right after the last selected layer (the layers above it
  and the LM head cannot change the maps), which also saves their compute.
- `maps(..., query_start=p)` keeps only the response rows [p:, :], which is all
  the rhythm metrics read.
"""

from __future__ import annotations

import copy
import os
from functools import partial

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from cadence.algo.rhythm import (
    CreditMode,
    RhythmBatch,
    RhythmConfig,
    rhythm_credit,
    select_layers,
)


class _StopForward(Exception):
    """Raised by the last capture hook: nothing above that layer changes the captured maps."""


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The stack of decoder blocks of a Hugging Face causal LM (each with a `self_attn`)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not all(hasattr(b, "self_attn") for b in layers):
        raise TypeError(
            f"{type(model).__name__}: cannot find decoder layers with a self_attn module"
        )
    return layers


class ActorAttention:
    """An eval, eager-attention copy of the policy that returns selected layers' attention maps.

    `model_or_path` is a loaded policy (deep-copied, so the trainer's model is
    untouched) or a checkpoint path. `layers` evenly spaced layers are read in
    [floor(L/3), floor(2L/3)] (fewer when the model is too shallow; see
    `select_layers`). Pass `RhythmConfig.layers` here.
    """

    def __init__(
        self,
        model_or_path: PreTrainedModel | str | os.PathLike,
        layers: int = 5,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        if isinstance(model_or_path, (str, os.PathLike)):
            kwargs = {"attn_implementation": "eager"}
            if dtype is not None:
                kwargs["dtype"] = dtype
            model = AutoModelForCausalLM.from_pretrained(str(model_or_path), **kwargs)
        else:
            model = copy.deepcopy(model_or_path)
            model.set_attn_implementation("eager")
            if dtype is not None:
                model.to(dtype)
        if device is not None:
            model.to(device)
        self.model = model.eval().requires_grad_(False)
        self.version = 0

        decoder = _decoder_layers(self.model)
        self.layer_ids = select_layers(len(decoder), layers)
        self._captured: list[torch.Tensor | None] | None = None  # None: hooks idle
        self._query_start = 0
        for slot, idx in enumerate(self.layer_ids):
            decoder[idx].self_attn.register_forward_hook(partial(self._capture, slot))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _capture(self, slot: int, module: nn.Module, args: tuple, output: tuple) -> None:
        """Forward hook on a selected self_attn: keep its (query-sliced) weights, stop after the last."""
        if self._captured is None:
            return
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None:
            raise RuntimeError(
                "attention module returned no weights: the model must run with "
                f"attn_implementation='eager' (has {self.model.config._attn_implementation!r})"
            )
        rows = weights[..., self._query_start :, :]
        self._captured[slot] = rows.float().clone() if self._query_start else rows.float()
        if slot == len(self.layer_ids) - 1:
            raise _StopForward

    # ------------------------------------------------------------------
    # Weights

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Copy the trainer's weights in (same architecture; tensors are copied, not shared)."""
        self.model.load_state_dict(state_dict, strict=strict)

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Sync to the trainer's policy `version`, like the inference engine's weight sync."""
        self.load_state_dict(state_dict)
        self.version = version

    # ------------------------------------------------------------------
    # Maps

    def maps(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        query_start: int = 0,
    ) -> torch.Tensor:
        """Attention maps of the selected layers, float32 and detached.

        input_ids [N] -> [layers, H, N - query_start, N]; [B, N] -> [B, layers, H, N - query_start, N].
        Row i is the query at position query_start + i. With left padding and an
        attention_mask the rows and columns of pad positions are meaningless;
        right padding needs no mask at all, since causal rows never see later pads.
        """
        single = input_ids.dim() == 1
        ids = input_ids.unsqueeze(0) if single else input_ids
        if attention_mask is not None and attention_mask.dim() == 1:
            attention_mask = attention_mask.unsqueeze(0)
        if not 0 <= query_start < ids.shape[1]:
            raise ValueError(
                f"query_start {query_start} outside a sequence of length {ids.shape[1]}"
            )
        device = self.device
        ids = ids.to(device)
        if attention_mask is not None:
            attention_mask = attention_mask.to(device)

        self._captured = [None] * len(self.layer_ids)
        self._query_start = query_start
        try:
            with torch.inference_mode():
                self.model(input_ids=ids, attention_mask=attention_mask, use_cache=False)
        except _StopForward:
            pass
        finally:
            captured, self._captured = self._captured, None
        out = torch.stack(captured, dim=1)  # [B, layers, H, rows, N]
        return out[0] if single else out

    # ------------------------------------------------------------------
    # Credit

    def token_credit(
        self,
        prompt_ids: torch.Tensor,
        response_ids: torch.Tensor,
        credit: CreditMode,
        cfg: RhythmConfig,
        loss_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict]:
        """Gammas [R] for one sample: maps -> head classes -> WAAD / FAI -> credit rule.

        `loss_mask` [R] (None: all ones) marks the response tokens that carry loss:
        only they are ranked for credit (an agentic episode's observations are not).
        A batch of one through `token_credit_padded`. info holds waad, fai,
        delta, spans, the local/global head indices, the selected token masks
        (local, anchors, dominated, introducer), the layers read and the weight
        version, all on CPU.
        """
        ids = torch.cat([prompt_ids.flatten(), response_ids.flatten()])[None]
        trained = None
        if loss_mask is not None:
            if loss_mask.numel() != response_ids.numel():
                raise ValueError(
                    f"loss_mask has {loss_mask.numel()} entries for {response_ids.numel()} "
                    "response tokens"
                )
            trained = torch.cat([torch.zeros(prompt_ids.numel()), loss_mask.flatten().float()])
            trained = trained.bool()[None]
        gammas, infos = self.token_credit_padded(
            ids, [prompt_ids.numel()], [ids.shape[1]], credit, cfg, with_info=True, trained=trained
        )
        return gammas[0], infos[0]

    def token_credit_batch(
        self,
        prompts: list[torch.Tensor],
        responses: list[torch.Tensor],
        credit: CreditMode,
        cfg: RhythmConfig,
        micro_batch: int | None = None,
        pad_id: int = 0,
        with_info: bool = True,
    ) -> list[tuple[torch.Tensor, dict]]:
        """`token_credit` for many samples, batched (see `token_credit_padded`).

        `micro_batch` sequences per forward (None: `cfg.micro_batch`). Returns
        (gamma, info) per sample, info as `token_credit`'s; with_info=False
        leaves info empty ({}), which saves building ten tensors per sample.
        """
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        if not prompts:
            return []
        seqs = [
            torch.cat([p.flatten(), r.flatten()]) for p, r in zip(prompts, responses, strict=True)
        ]
        lengths = torch.tensor([s.numel() for s in seqs])
        starts = torch.tensor([p.numel() for p in prompts])
        ids = torch.full((len(seqs), int(lengths.max())), pad_id, dtype=torch.long)
        for row, seq in enumerate(seqs):
            ids[row, : seq.numel()] = seq
        gammas, infos = self.token_credit_padded(
            ids,
            starts,
            lengths,
            credit,
            cfg,
            micro_batch=micro_batch,
            pad_id=pad_id,
            with_info=with_info,
        )
        return list(zip(gammas, infos if with_info else [{} for _ in gammas], strict=True))

    def token_credit_padded(
        self,
        input_ids: torch.Tensor,
        response_start: torch.Tensor,
        lengths: torch.Tensor,
        credit: CreditMode,
        cfg: RhythmConfig,
        micro_batch: int | None = None,
        pad_id: int = 0,
        with_info: bool = False,
        trained: torch.Tensor | None = None,
    ) -> tuple[list[torch.Tensor], list[dict]]:
        """`credit`'s gammas [R_b] of every row of a right-padded batch, and info dicts if asked.

        Row b holds `lengths[b]` real tokens, its response from position
        `response_start[b]` on (a `TrainBatch` has these as attention_mask.sum(1)
        and response_start + 1). `trained` [B, L] (None: every response token),
        aligned with input_ids, marks the positions whose token carries loss: only
        those are ranked for credit (`credit_selection`). Per micro-batch of `micro_batch` rows (None:
        `cfg.micro_batch`) one forward and one `rhythm_credit`, no loop over
        samples. Right padding needs no attention mask: causal rows never see the
        pads after them, so each row's maps are its unpadded maps. Peak memory:
        micro_batch x layers x H x (n - min response start) x n floats for the
        longest row n of a micro-batch.

        Two savings that leave every result unchanged:
        - identical rows (same tokens and response start) are read once. GRPO
          samples several answers per prompt, and short answers often coincide;
          identical inputs give identical maps and gammas.
        - rows are grouped by length, so a micro-batch pads only to its own longest.

        The returned gammas (and info tensors) may be views of shared tensors;
        duplicate rows may share one. infos is [] unless with_info (then one dict
        per row, as `token_credit` gives).
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, L], got {tuple(input_ids.shape)}")
        b = input_ids.shape[0]
        if b == 0:
            return [], []
        micro_batch = micro_batch or cfg.micro_batch
        # Row bookkeeping (checks, dedup, grouping) is host work; `maps` moves each micro-batch
        # to the model's device.
        starts = torch.as_tensor(response_start, device="cpu").long().flatten()
        lengths = torch.as_tensor(lengths, device="cpu").long().flatten()
        if starts.numel() != b or lengths.numel() != b:
            raise ValueError(f"{starts.numel()} starts and {lengths.numel()} lengths for {b} rows")
        width = int(lengths.max())
        if bool((lengths < 1).any() | (starts < 0).any() | (starts > lengths).any()) or (
            width > input_ids.shape[1]
        ):
            raise ValueError(
                f"need 0 <= response_start <= length <= {input_ids.shape[1]} and length >= 1 "
                f"(got response_start {starts.tolist()}, lengths {lengths.tolist()})"
            )

        # Tokens past a row's length are padding whatever their value: blank them so
        # that they neither split duplicates nor reach the forward.
        ids = input_ids[:, :width].cpu().long()
        beyond = torch.arange(width, device="cpu") >= lengths[:, None]
        ids = ids.masked_fill(beyond, pad_id)
        if trained is None:
            trained = torch.ones_like(ids, dtype=torch.bool)
        elif trained.shape[0] != b or trained.shape[1] < width:
            raise ValueError(f"trained must be [B, L] like input_ids, got {tuple(trained.shape)}")
        marks = trained[:, :width].cpu().bool().masked_fill(beyond, False).long()
        key = torch.cat([ids, marks, starts[:, None], lengths[:, None]], dim=1)
        unique, inverse = torch.unique(key, dim=0, return_inverse=True)
        u_ids, u_marks = unique[:, :width], unique[:, width : 2 * width].bool()
        u_start, u_len = unique[:, 2 * width], unique[:, 2 * width + 1]
        order = torch.argsort(u_len, stable=True)

        u_gammas: list[torch.Tensor] = [torch.empty(0, device="cpu")] * len(unique)
        u_infos: list[dict] = [{}] * len(unique)
        for lo in range(0, len(order), micro_batch):
            rows = order[lo : lo + micro_batch]
            n, q0 = int(u_len[rows].max()), int(u_start[rows].min())
            q0 = min(q0, n - 1)  # maps need one row at least (an all-empty-response chunk)
            maps = self.maps(u_ids[rows, :n], query_start=q0)  # [b, layers, H, n - q0, n]
            # Response token i of row j sits at position start_j + i (past its end: padding).
            r_max = max(int((u_len[rows] - u_start[rows]).max()), 1)
            at = (u_start[rows, None] + torch.arange(r_max, device="cpu")).clamp(max=width - 1)
            picked_marks = u_marks[rows].gather(1, at).to(maps.device)
            result = rhythm_credit(maps, u_start[rows], u_len[rows], credit, cfg, picked_marks)
            # One device-to-host copy per micro-batch; the trainer needs only the gammas.
            if with_info:
                result = result.to("cpu")
            counts = result.valid.sum(1).tolist()
            flat = result.gamma[result.valid].cpu()
            picked = rows.tolist()
            for slot, gamma in zip(picked, flat.split(counts), strict=True):
                u_gammas[slot] = gamma
            if with_info:
                for j, slot in enumerate(picked):
                    u_infos[slot] = self._info(result, j)
        back = inverse.tolist()
        gammas = [u_gammas[j] for j in back]
        infos = [dict(u_infos[j]) for j in back] if with_info else []
        return gammas, infos

    def _info(self, result: RhythmBatch, row: int) -> dict:
        """`token_credit`'s info dict for one row of a batched result (CPU tensors)."""
        r = int(result.valid[row].sum())
        sel = result.selection
        return {
            "waad": result.waad[row, :r],
            "fai": result.fai[row, :r],
            "delta": sel.delta[row, :r],
            "spans": result.spans[row],
            "local_heads": result.local_heads[row],
            "global_heads": result.global_heads[row],
            "local": sel.local[row, :r],
            "anchors": sel.anchors[row, :r],
            "dominated": sel.dominated[row, :r],
            "introducer": sel.introducer[row, :r],
            "layers": list(self.layer_ids),
            "version": self.version,
        }
