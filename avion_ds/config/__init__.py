"""Recipe = typed dataclasses loaded from YAML, validated once, with dotted command-line overrides.

A recipe is the whole description of a run except the DeepSpeed JSON (which the user passes
separately and `avion_ds.distributed.ds_config.build_ds_config` merges with the recipe). The modules:
``sections`` (the core section dataclasses), ``recipe`` (the Recipe, sections registered by tasks with
:func:`register_section`, renamed keys with :func:`rename_key`), ``loading`` (YAML, ``--set``, coercion,
unknown keys named) and ``checks`` (generic validation). No task's section or key lives here.
"""

from avion_ds.config.checks import FLOAT32_MAX, validate
from avion_ds.config.loading import (
    add_override_option,
    apply_overrides,
    load_recipe_data,
    recipe_from_dict,
    save_recipe,
    with_defaults,
)
from avion_ds.config.recipe import (
    ConfigError,
    Range,
    Recipe,
    Section,
    register_section,
    registered_sections,
    rename_key,
    renamed_keys,
    resolve_renamed,
)
from avion_ds.config.sections import (
    BatchConfig,
    CheckpointConfig,
    DataConfig,
    EmaConfig,
    EvalConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    ScheduleConfig,
)

__all__ = [
    "FLOAT32_MAX",
    "BatchConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "EmaConfig",
    "EvalConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "Range",
    "Recipe",
    "ScheduleConfig",
    "Section",
    "add_override_option",
    "apply_overrides",
    "load_recipe_data",
    "recipe_from_dict",
    "register_section",
    "registered_sections",
    "rename_key",
    "renamed_keys",
    "resolve_renamed",
    "save_recipe",
    "validate",
    "with_defaults",
]
