"""The seeded, tiered synthetic recipe graph of TextCraft-Synth (docs/environments/textcraft.md).

Items live in 5 material domains (``m`` metal, ``c`` crystal, ``w`` wood, ``s`` stone, ``e`` essence) and tiers
0..12, plus cross-domain items (``x``) at tiers 10..12; names are opaque ids (``m3_i5``: domain m, tier 3, item
5). Tier 0 items are base materials; every other item has exactly one recipe, drawn by the paper's rules
(ingredients from the tiers below, their number and counts, the yields by tier). Project choice: every recipe
holds at least one ingredient from the tier just below, so an item's crafting depth equals its tier and
difficulty is a property of the target's tier. The graph is a pure function of ``(seed, items_per_tier)``,
built once per process and cached (:func:`recipe_graph`). Docs: docs/environments/textcraft.md.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field

DOMAINS: tuple[str, ...] = ("m", "c", "w", "s", "e")
CROSS_DOMAIN = "x"
MAX_TIER = 12
CROSS_MIN_TIER = 10
GRAPH_VERSION = 1


@dataclass(frozen=True)
class Recipe:
    """One recipe: ``ingredients`` per execution and ``result_count`` items produced per execution."""

    ingredients: dict[str, int]
    result_count: int


@dataclass
class RecipeGraph:
    """All items with their tier and (for tier >= 1) their recipe. Build with ``recipe_graph``."""

    seed: int
    items_per_tier: int
    tier: dict[str, int] = field(default_factory=dict)  # item -> tier (= crafting depth)
    recipes: dict[str, Recipe] = field(default_factory=dict)  # item -> recipe (craftable items only)
    by_tier: dict[int, list[str]] = field(default_factory=dict)  # tier -> items, in creation order

    def is_base(self, item: str) -> bool:
        """True for a tier-0 (base) item."""
        return self.tier[item] == 0

    def info(self, item: str, held: int) -> dict:
        """The ``get_info`` record of one item (JSON-serialisable)."""
        recipe = self.recipes.get(item)
        return {
            "item": item,
            "craftable": recipe is not None,
            "base": recipe is None,
            "held": held,
            "depth": self.tier[item],
            "recipes": [] if recipe is None else [
                {"ingredients": dict(recipe.ingredients), "result_count": recipe.result_count}],
        }


def _n_near(tier: int) -> int:
    if tier == 1:
        return 1
    if tier <= 7:
        return 2
    if tier <= 11:
        return 3
    return 4


def _yield_range(tier: int) -> tuple[int, int]:
    if tier == 1:
        return 2, 4
    if tier == 2:
        return 2, 3
    if tier <= 5:
        return 1, 2
    return 1, 1


@functools.lru_cache(maxsize=8)
def recipe_graph(seed: int = 0, items_per_tier: int = 25, *, near_prob: float = 0.65, extra_prob: float = 0.15,
                 far_prob: float = 0.2) -> RecipeGraph:
    """Build (or fetch from the per-process cache) the recipe graph for ``seed``.

    Args:
        seed: graph seed; the same seed gives the same graph.
        items_per_tier: items per domain and tier (tiers 0..12, 5 domains); cross-domain items add
            ``items_per_tier // 2`` per tier at tiers 10..12.
        near_prob: probability that a non-first near ingredient comes from tier t-1 (else t-2).
        extra_prob: probability of one extra near ingredient.
        far_prob: probability of one extra ingredient from 3..4 tiers below (tiers >= 4).

    Raises:
        ValueError: ``items_per_tier`` < 4 (recipes need distinct ingredients to choose from).
    """
    if items_per_tier < 4:
        raise ValueError(f"items_per_tier must be >= 4, got {items_per_tier}")
    rng = random.Random(f"textcraft-synth-graph:v{GRAPH_VERSION}:{seed}:{items_per_tier}")
    g = RecipeGraph(seed=seed, items_per_tier=items_per_tier)
    pools: dict[tuple[str, int], list[str]] = {}
    for tier in range(MAX_TIER + 1):
        g.by_tier[tier] = []
        domains = list(DOMAINS) + ([CROSS_DOMAIN] if tier >= CROSS_MIN_TIER else [])
        for dom in domains:
            n_items = items_per_tier if dom != CROSS_DOMAIN else max(2, items_per_tier // 2)
            pools[(dom, tier)] = []
            for k in range(n_items):
                item = f"{dom}{tier}_i{k}"
                g.tier[item] = tier
                g.by_tier[tier].append(item)
                pools[(dom, tier)].append(item)
                if tier == 0:
                    continue

                def pool(t: int, dom: str = dom) -> list[str]:
                    if dom != CROSS_DOMAIN:
                        return pools[(dom, t)]
                    # cross-domain items mix every domain (and lower cross-domain items)
                    return [i for d in (*DOMAINS, CROSS_DOMAIN) for i in pools.get((d, t), [])]

                chosen: list[str] = [rng.choice(pool(tier - 1))]
                n_near = min(_n_near(tier) + (1 if rng.random() < extra_prob else 0), 6)
                while len(chosen) < n_near:
                    t = tier - 1 if (tier < 2 or rng.random() < near_prob) else tier - 2
                    cand = rng.choice(pool(t))
                    if cand not in chosen:
                        chosen.append(cand)
                if tier >= 4 and len(chosen) < 6 and rng.random() < far_prob:
                    cand = rng.choice(pool(tier - rng.randint(3, 4)))
                    if cand not in chosen:
                        chosen.append(cand)
                lo, hi = _yield_range(tier)
                g.recipes[item] = Recipe(
                    ingredients={i: (rng.randint(1, 2) if tier <= 3 else 1) for i in chosen},
                    result_count=rng.randint(lo, hi),
                )
    return g
