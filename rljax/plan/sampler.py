"""The sampler's two programs, lowered from its own decode core (`rljax.sampling.decode`):

- `prefill`: `prefill_rows` over every rollout row (one prefill per prompt with
  `sampling.share_prefill`), returning the last logits and the prompt's KV cache; over
  one wave of rows for the static sampler with `sampling.slots`;
- `decode`: one `decode_step` over the rows decoded together, with the KV cache at its full
  length P + T, the loop's invariants (the fused q|k|v and gate|up weights, the uniforms
  of every step) as arguments and its carry donated, as the `while_loop` keeps it in place.

Placement follows the trainer's sampler: the continuous sampler (`sampling.continuous`,
the default) runs one slot loop per batch shard in a `shard_map` whose parameters are
whole on every device (rows split); the static sampler is one GSPMD program over the
parameters' own shardings. With `parallel.sampler_devices` both run on the sampler's mesh.

Note: the continuous sampler's decode step is its ring-buffer variant of `decode_step`
(the same forward over the same cache); its drain phase decodes fewer rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rljax import parallel
from rljax.plan.abstract import AbstractRun, sharded
from rljax.sampling.decode import (
  Decoded,
  decode_step,
  fused_weights,
  prefill_rows,
  route_buffer,
  spec_and_scalars,
  step_from_uniforms,
)
from rljax.sampling.params import SamplingParams
from rljax.train.params import policy_params


def _rows_axis(shape_small, shape_big):
  """The axis that doubles when the rows double (None: no rows axis)."""
  for axis, (a, b) in enumerate(zip(shape_small, shape_big)):
    if b == 2 * a and a:
      return axis
  return None


def _row_specs(fn, rows: int, axes):
  """PartitionSpecs of the abstract leaves `fn(rows)` returns, `axes` on their rows axis."""
  small, big = fn(rows), fn(2 * rows)

  def spec(a, b):
    axis = _rows_axis(a.shape, b.shape)
    return P() if axis is None else P(*([None] * axis), axes)
  return jax.tree.map(spec, small, big)


class SamplerPrograms:
  """Builds the `prefill` and `decode` programs of `run`'s sampler (see the module doc)."""

  def __init__(self, run: AbstractRun):
    self.run = run
    self.mesh = run.sampler_mesh or run.mesh
    self.axes = tuple(a for a in parallel.BATCH_AXES if a in self.mesh.axis_names)
    self.shards = parallel.batch_shards(self.mesh)
    self.per_shard = run.specs.rollout.continuous
    s, r = run.shapes, run.specs.rollout
    sampling = SamplingParams(max_new_tokens=s.response_len, temperature=r.temperature,
                              top_k=r.top_k, top_p=r.top_p, min_p=r.min_p, n=r.n)
    self.spec, self.scalars = spec_and_scalars(sampling, 0, r.n if r.share_prefill else 1)
    self.graphdef = run.params.actor_graphdef
    params = policy_params(run.state)
    if run.sampler_mesh is not None:   # the weights handed to the sampler's own devices
      params = sharded(params, parallel.state_shardings(params, run.sampler_mesh))
    self.params = params

  def _model(self, state):
    return nnx.merge(self.graphdef, state)

  def _local(self, rows: int) -> int:
    return rows // self.shards if self.per_shard else rows

  def _lower(self, fn, whole, row_makes, rows: int, donate=()):
    """`fn(*whole, *row inputs)` lowered: `whole` (parameters) with their own shardings,
    each `row_makes[i](rows)` with its rows split over the batch axes; per shard, in a
    `shard_map` that needs `whole` entire on every device (XLA gathers it)."""
    row_specs = [_row_specs(m, rows, self.axes) for m in row_makes]
    row_args = [sharded(m(rows), jax.tree.map(lambda p: NamedSharding(self.mesh, p), s))
                for m, s in zip(row_makes, row_specs)]
    args = (*whole, *row_args)
    if not self.per_shard:   # the static sampler: traced under its mesh, as it runs
      return jax.jit(parallel.traced_on(self.mesh, fn), donate_argnums=donate).lower(*args), args
    out_specs = _row_specs(lambda r: jax.eval_shape(fn, *whole, *[m(r) for m in row_makes]),
                           self._local(rows), self.axes)
    mapped = jax.shard_map(fn, mesh=self.mesh, out_specs=out_specs, check_vma=False,
                           in_specs=(*[jax.tree.map(lambda _: P(), w) for w in whole],
                                     *row_specs))
    return jax.jit(mapped, donate_argnums=donate).lower(*args), args

  def prefill(self):
    """The lowered prefill of every rollout row (the sampler's prompt bucket)."""
    s = self.run.shapes
    rows, width = s.rows + (-s.rows) % self.shards, s.sampler_prompt_len
    local = self._local(rows)
    if not self.per_shard:   # the static sampler prefills one wave of rows at a time
      rows, local = s.decode_rows, s.decode_rows // self.shards
    group = self.spec.group
    spec = self.spec._replace(group=group if local % group == 0 else 1)

    def fn(state, tokens, mask):   # a MoE policy's prompt routes come out with the cache
      model = self._model(state)
      logits, cache, _, _, routes = prefill_rows(model, tokens, mask, spec, fused_weights(model))
      return logits, cache, routes
    make = lambda r: jax.ShapeDtypeStruct((r, width), jnp.int32)  # noqa: E731
    return self._lower(fn, [self.params], [make, make], rows)

  def _carry(self, rows: int):
    """(t, last tokens, KV cache of P + T slots, outputs) of `rows` rows; the outputs hold
    a MoE policy's route buffer [rows, P + T, L_moe, k] (`decode.route_buffer`)."""
    s = self.run.shapes
    model = nnx.eval_shape(lambda: self._model(self.params))
    window = s.sampler_prompt_len + s.response_len
    cache = jax.eval_shape(lambda: model.init_cache(rows, window))
    routes = jax.eval_shape(lambda: route_buffer(model, rows, window))
    t = s.response_len
    out = Decoded(tokens=jax.ShapeDtypeStruct((rows, t), jnp.int32),
                  mask=jax.ShapeDtypeStruct((rows, t), jnp.int32),
                  logp=jax.ShapeDtypeStruct((rows, t), jnp.float32),
                  logp_full=jax.ShapeDtypeStruct((rows, t), jnp.float32),
                  truncated=jax.ShapeDtypeStruct((rows,), jnp.bool_), routes=routes)
    return (jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((rows,), jnp.int32),
            cache, out)

  def decode(self):
    """The lowered decode step (cache at P + T slots, carry donated)."""
    s = self.run.shapes
    rows, p = s.decode_rows, s.sampler_prompt_len
    window = p + s.response_len
    greedy = self.spec.greedy

    def fn(state, fused, carry, kv_mask, prompt_len, uniform_tr):
      step = step_from_uniforms(self.spec, jnp.asarray(self.scalars),
                                None if greedy else uniform_tr)
      return decode_step(self._model(state), step, self.spec, prompt_len, p, kv_mask, fused,
                         carry)
    makes = [self._carry, lambda r: jax.ShapeDtypeStruct((r, window), jnp.int32),
             lambda r: jax.ShapeDtypeStruct((r,), jnp.int32),
             lambda r: jax.ShapeDtypeStruct((1 if greedy else s.response_len, r), jnp.float32)]
    return self._lower(fn, [self.params, self._fused()], makes, rows, donate=(2,))

  def _fused(self):
    """The fused weights as the sampler holds them through its loop: whole on each device
    (per shard), else with the shardings XLA gives them (read from a compile)."""
    make = jax.jit(lambda state: fused_weights(self._model(state)))
    shapes = jax.eval_shape(make, self.params)
    if self.per_shard:
      return sharded(shapes, jax.tree.map(lambda _: NamedSharding(self.mesh, P()), shapes))
    out = make.lower(self.params).compile().output_shardings
    keep = lambda s: s if isinstance(s, NamedSharding) else NamedSharding(self.mesh, P())  # noqa: E731
    return sharded(shapes, jax.tree.map(keep, out))
