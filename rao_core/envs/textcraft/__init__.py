"""TextCraft-Synth: a seeded tiered recipe graph, task generator and exactly verifiable environment.

Modules: ``graph`` (the recipe graph), ``tasks`` (task generation, gold plans, split), ``env`` (the
environment and its tools). See ``docs/environments/textcraft.md`` for measured task statistics.
"""

from rao_core.envs.textcraft.env import TextCraftEnv, TextCraftEpisode, format_targets
from rao_core.envs.textcraft.graph import Recipe, RecipeGraph, recipe_graph
from rao_core.envs.textcraft.tasks import (
    DIFFICULTIES, NESTED, expanded_base_needs, generate_textcraft_tasks, graph_of, nest_items, plan_crafts,
    split_items,
)

__all__ = [
    "DIFFICULTIES", "NESTED", "Recipe", "RecipeGraph", "TextCraftEnv", "TextCraftEpisode", "expanded_base_needs",
    "format_targets", "generate_textcraft_tasks", "graph_of", "nest_items", "plan_crafts", "recipe_graph",
    "split_items",
]
