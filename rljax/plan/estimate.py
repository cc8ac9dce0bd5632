"""What an iteration costs at the roofline, and the update's model-FLOP utilisation.

An iteration is one generation (one prefill, then T decode steps in which every row is
counted, at the full cache length), the forwards (old and reference log-probs, values,
the teacher) and `epochs × minibatches` update steps. Each program's time is its
roofline, max(FLOPs / peak, bytes / HBM bandwidth) on one chip: a lower bound (no
collective is timed, no overlap is lost, every op runs at peak).

The update's compute time is at least its model FLOPs (6N + attention per token) over the
chips' peak: where the compiled program's counted FLOPs fall below that (on v5p the TPU
compiler's collective matmuls are loops whose trip count the HLO does not state, so their
FLOPs are counted once), the model count sets the update's time and `update_flops_counted`
(counted / model FLOPs) says by how much the count fell short; the MFU then reads at most
100 %.
"""

from __future__ import annotations

from rljax.models import ModelConfig

PHASES = {"prefill": "generation", "decode": "generation", "logprobs": "forwards", "routing": "forwards",
          "values": "forwards", "teacher": "forwards", "update": "update"}


def matmul_params(cfg: ModelConfig) -> float:
  """N: parameters that take part in a matmul per token (every decoder block's projections
  and the lm head; the embedding is a lookup). A mixture-of-experts layer counts its
  active parameters: the router, the token's k experts and a shared expert."""
  d, dh = cfg.hidden_size, cfg.head_dim
  attention = d * dh * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
  moe = sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
  routed = (d * cfg.num_experts + 3 * d * cfg.moe_intermediate_size * cfg.num_experts_per_tok
            + 3 * d * cfg.shared_expert_intermediate_size
            + (d if cfg.shared_expert_intermediate_size else 0)) if moe else 0
  mlp = (cfg.num_layers - moe) * 3 * d * cfg.intermediate_size + moe * routed
  return float(cfg.num_layers * attention + mlp + d * cfg.vocab_size)


def training_flops_per_token(cfg: ModelConfig, context: int, *, lora: bool = False) -> float:
  """Model FLOPs of a forward and backward pass per token, PaLM's count (Chowdhery et al.
  2022, arXiv:2204.02311, App. B): 6N + 12·L·H·Dh·S, S the sequence length.

  Note: the attention term counts the whole S×S score matrix (the causal half is not
  skipped, and the XLA path computes it all); with LoRA the frozen base gets no weight
  gradient, so the matmul term is 4N.
  """
  return (4.0 if lora else 6.0) * matmul_params(cfg) + 12.0 * (
      cfg.num_layers * cfg.num_heads * cfg.head_dim * context)


def forward_flops_per_token(cfg: ModelConfig, context: int) -> float:
  """Model FLOPs of a forward pass per token attending to `context` positions: 2N +
  4·L·H·Dh·context (PaLM's count without the backward pass)."""
  return 2.0 * matmul_params(cfg) + 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context


def iteration(programs: list[dict], *, model_cfg: ModelConfig, context: int, chips: int,
              peak_flops: float | None, lora: bool) -> dict:
  """{"roofline_s", per-phase seconds, "update_mfu"} of one iteration.

  Args:
    programs: the plan's program reports (`roofline_s`, `calls`, `tokens`).
    context: S = P + T of the update's sequences.
    peak_flops: one chip's peak (None: no estimate).
  """
  phases = {"generation": 0.0, "forwards": 0.0, "update": 0.0}
  if peak_flops is None:
    return {"roofline_s": None, **{f"{k}_s": None for k in phases}, "update_mfu": None,
            "update_flops_counted": None}
  update = next((p for p in programs if p["name"] == "update"), None)
  mfu = counted = None
  update_s = update and update["roofline_s"]
  if update_s and update["compiled"]:
    useful = update["tokens"] * training_flops_per_token(model_cfg, context, lora=lora)
    counted = update["flops"] * chips / useful
    update_s = max(update_s, useful / (chips * peak_flops))
    mfu = useful / (chips * peak_flops * update_s)
  for p in programs:
    seconds = update_s if p is update else p["roofline_s"]
    phases[PHASES[p["name"]]] += (seconds or 0.0) * p["calls"]
  return {"roofline_s": sum(phases.values()), **{f"{k}_s": v for k, v in phases.items()},
          "update_mfu": mfu, "update_flops_counted": counted}
