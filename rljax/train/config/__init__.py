"""The run's configuration: the one base config, loading and validation, and the specs.

`base_config()` holds every field (the public override API), `load_config` reads an
experiment file with overrides and validates it once, and `build_specs` turns a validated
config into small frozen specs, one per concern. The specs are what the rest of the trainer
reads: nothing after `rljax.train.run.build` holds the ConfigDict.
"""

from ml_collections import ConfigDict

from rljax.train.config.defaults import base_config, completion_columns, eval_set
from rljax.train.config.fields import ConfigError
from rljax.train.config.loading import (
    apply_overrides,
    import_experiment,
    load_config,
    parse_override_value,
    saved_config,
    validate,
)

__all__ = [
    "ConfigDict", "ConfigError", "apply_overrides", "base_config", "completion_columns",
    "eval_set", "import_experiment", "load_config", "parse_override_value", "saved_config",
    "validate",
]
