"""A plan as text: a table per program, the iteration estimate, what does not fit and what
would; and the one-line `RESULT`."""

from __future__ import annotations

import json

PROGRAM_FIELDS = ("name", "fits", "compile_s", "flops", "bytes_accessed", "per_chip_bytes",
                  "hbm_bytes", "collectives", "roofline_s")


def _gb(x) -> str:
  return "-" if x is None else f"{x / 1e9:.2f}"


def _s(x) -> str:
  if x is None:
    return "-"
  return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.2f} s"


def _collectives(c: dict) -> str:
  return ", ".join(f"{k} {v['count']}x {v['bytes'] / 1e9:.2f} GB" for k, v in sorted(c.items())) or "-"


def program_table(programs: list[dict]) -> list[str]:
  """The Markdown table of the programs' reports, one line each."""
  head = ("| program | fits | per-chip GB (args / out / temp / resident = total) | HBM GB "
          "| TFLOP | GB moved | roofline | calls | compile s |")
  lines = [head, "|" + "---|" * 9]
  for p in programs:
    b = p["per_chip_bytes"]
    mem = (f"{_gb(b['arguments'])} / {_gb(b['outputs'])} / {_gb(b['temporaries'])} / "
           f"{_gb(b['resident'])} = **{_gb(b['total'])}**")
    lines.append(f"| {p['name']} | {'yes' if p['fits'] else 'NO'} | {mem} | {_gb(p['hbm_bytes'])} "
                 f"| {p['flops'] / 1e12:.3g} | {p['bytes_accessed'] / 1e9:.3g} "
                 f"| {_s(p['roofline_s'])} {p['bound']} | {p['calls']:g} | {p['compile_s']:.1f} |")
  return lines


def _not_fitting(plan: dict) -> list[str]:
  lines = []
  for p in plan["programs"]:
    if p["fits"]:
      continue
    why = p.get("error") or (f"{_gb(p['per_chip_bytes']['total'])} GB per chip > "
                             f"{_gb(p['hbm_bytes'])} GB")
    lines.append(f"- {p['name']} does not fit: {why}")
    for buf in p["largest_buffers"][:3]:
      where = " (whole mesh, before sharding)" if buf.get("whole_mesh") else ""
      lines.append(f"    {_gb(buf['bytes'])} GB {buf['shape']}{where}  ({buf['op'][-90:]})")
  search = plan.get("search") or {}
  tried = [c for c in search.get("candidates", []) if c["tried"]]
  for c in tried:
    lines.append(f"  tried {_flags(c['overrides'])}: {'fits' if c['fits'] else 'does not fit'} "
                 f"(largest {_gb(max(c['totals'].values(), default=0))} GB)")
  best = search.get("suggestion")
  if search and not best:
    shrink = ("e.g. a memory-linear attention for [B, H, S, S] scores: "
              "--config.model.attention=auto" if plan["model"]["attention"] == "xla" else
              "the attention is memory-linear already: more chips, fewer rows per chip or "
              "shorter sequences")
    lines.append("- no change the search knows is estimated to fit: the largest arrays above "
                 f"must shrink ({shrink})")
  if best:
    state = ("compiled, fits" if best["fits"] else
             f"not compiled; estimated {_gb(best['estimate'])} GB per chip")
    lines.append(f"- suggestion: {_flags(best['overrides'])}  ({best['why']}; {state})")
  untried = len(search.get("candidates", [])) - len(tried)
  if untried:
    lines.append(f"  {untried} more candidates ranked in --json 'search' (raise --search to "
                 "compile more)")
  return lines


def _attention(plan: dict) -> str:
  """The configured attention, and the Pallas kernel it compiled to (`auto` on TPU)."""
  kernels = {k for p in plan["programs"] for k in p.get("kernels") or {}}
  splash = any(k.startswith("splash") for k in kernels)
  return plan["model"]["attention"] + (" (Pallas splash compiled)" if splash else "")


def _flags(overrides: dict) -> str:
  return " ".join(f"--config.{k}={str(v).lower() if isinstance(v, bool) else v}"
                  for k, v in overrides.items())


def _experts(plan: dict) -> str:
  """A MoE policy's experts and its recorded routes per chip ("" for a dense policy)."""
  m, r = plan["model"], plan.get("routes_bytes")
  if not m.get("experts"):
    return ""
  out = (f"\nexperts: {m['experts']} per MoE layer, top {m['experts_per_token']}, in "
         f"{m['moe_layers']} layers; {m['matmul_params'] / 1e9:.2f} B matmul parameters active "
         "per token")
  if r:
    out += (f"; recorded routes ({r['dtype']}) per chip: sampler {_gb(r['sampler'])} GB, "
            f"rollout {_gb(r['rollout'])} GB")
  return out


def text(plan: dict) -> str:
  """The readable plan."""
  chip, it, st = plan["chip"], plan["iteration"], plan["state_bytes"]
  m, s = plan["model"], plan["shapes"]
  lines = [f"rljax plan: {plan['topology']} = {plan['chips']} chips ({plan['libtpu_topology']}), "
           f"mesh {plan['mesh']}" + (f", sampler mesh {plan['sampler_mesh']}"
                                     if plan["sampler_mesh"] else ""),
           f"model: {m['source']}, {m['layers']} layers, {m['params'] / 1e9:.2f} B parameters "
           f"({m['param_dtype']} params, {m['dtype']} compute, remat {m['remat']}, "
           f"LoRA rank {m['lora_rank']}, attention {_attention(plan)})" + _experts(plan),
           f"shapes: {s['rows']} rows x (P {s['prompt_len']} + T {s['response_len']}), "
           f"minibatch {s['minibatch']} in {s['microbatches']} micro-batches, "
           f"{s['decode_rows']} rows decoded together",
           f"state per chip: params {_gb(st['params'])} GB, optimizer {_gb(st['optimizer'])}, "
           f"reference {_gb(st['reference'])}, critic {_gb(st['critic'])}, "
           f"teacher {_gb(st['teacher'])} (total {_gb(st['total'])} GB)"]
  if chip:
    lines.append(f"chip {chip['name']}: {chip['peak_flops'] / 1e12:.0f} TFLOP/s bf16, "
                 f"{_gb(chip['hbm_bytes'])} GB HBM (limit {_gb(chip['hbm_limit'])} GB), "
                 f"{chip['hbm_bandwidth'] / 1e9:.0f} GB/s ({chip['source']})")
  lines += ["", *program_table(plan["programs"]), ""]
  for p in plan["programs"]:
    lines.append(f"  {p['name']} collectives: {_collectives(p['collectives'])}")
  mfu = it["update_mfu"]
  lines += ["", f"iteration at the roofline (a lower bound): {_s(it['roofline_s'])} = generation "
            f"{_s(it['generation_s'])} + forwards {_s(it['forwards_s'])} + update "
            f"{_s(it['update_s'])}; update MFU at the roofline "
            f"{'-' if mfu is None else f'{mfu:.1%}'}"]
  counted = it.get("update_flops_counted")
  if counted is not None and counted < 1:
    lines.append(f"note: the update's compiled FLOPs count {counted:.0%} of its model FLOPs "
                 "(loops whose trip count the HLO does not state are counted once); its "
                 "time is set by the model FLOPs")
  lines += [f"note: {n}" for n in plan["notes"]]
  lines += _not_fitting(plan)
  return "\n".join(lines)


def result_line(plan: dict) -> str:
  """`RESULT {...}`: fits, chips, the largest per-chip total, the iteration estimate."""
  worst = max(plan["programs"], key=lambda p: p["per_chip_bytes"]["total"])
  return "RESULT " + json.dumps({
      "metric": "plan", "topology": plan["topology"], "chips": plan["chips"],
      "fits": plan["fits"], "largest_program": worst["name"],
      "largest_per_chip_gb": round(worst["per_chip_bytes"]["total"] / 1e9, 3),
      "iteration_roofline_s": plan["iteration"]["roofline_s"],
      "update_mfu": plan["iteration"]["update_mfu"],
      "compile_s": round(sum(p["compile_s"] for p in plan["programs"]), 1)})
