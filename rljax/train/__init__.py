"""The trainer, in rooms with one-way doors:

  config/   the base config, loading, validation, and the specs built from it
  params/   the policy, the reference and the value model; TrainState; checkpoints
  rollout/  prompts -> scored RolloutBatch, single-turn or episodic; iteration t's batch,
            now or from the sampler thread; evaluation
  update/   the objective, advantages, packing, batch preparation, the update step, SFT
  run/      build (where the config ends), the iteration, the loop, held-out evaluation,
            metrics, RS-FT
  ablate/   every step of an experiment file over seeds, paired effects, the report

Arrows run `ablate -> run -> update -> rollout, params -> config`. `rljax.train.loop.train`
and `rljax.train.config.{base_config, load_config}` are the stable entry points.
"""
