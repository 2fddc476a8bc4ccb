"""TextCraft-Synth RL task generation: targets, starting inventory, gold crafting plan, split.

A task's ``Task.data``: ``targets`` {item: count}, ``depth``, ``difficulty``, ``inventory`` (base materials only),
``gold_plan`` (one batched craft per distinct intermediate, lowest tier first; replaying it with
``craft(ingredients, (item, total))`` solves the task) and ``graph`` (enough to rebuild the recipe graph).
Difficulties: the paper's four levels by target crafting depth (``easy`` 2-3, ``medium`` 4-6, ``hard`` 7-9,
``extreme`` 10-12; ``"mixed"`` cycles through them) and three CPU-scale shapes NOT in the paper (project
additions): ``tier1`` (one or two tier-1 targets), ``tier1x<K>`` (K distinct tier-1 targets: a delegation shape)
and ``nest<L>`` (a tier-(L+1) target made from ``NEST_BRANCHING`` ``nest<L-1>`` sub-goals: :func:`nest_items`).
Project choice, following the reference generator: the starting inventory covers the *fully expanded* crafting
tree (yields ignored) plus a buffer and distractors, so every sensible split into sub-agents is feasible. Split:
per tier, a seeded ``VALIDATION_FRACTION`` of the items are validation-only targets.
Docs: docs/environments/textcraft.md (tasks, "The tier1xK shape", "The nested shape").
"""

from __future__ import annotations

import random
from typing import Annotated, Any

from pydantic import Field, validate_call

from rao_core.envs.base import Task, difficulty_levels
from rao_core.envs.textcraft.graph import GRAPH_VERSION, MAX_TIER, RecipeGraph, recipe_graph

PAPER_DIFFICULTIES: dict[str, tuple[int, int]] = {"easy": (2, 3), "medium": (4, 6), "hard": (7, 9),
                                                  "extreme": (10, 12)}
#: difficulty -> (lowest, highest) target tier; ``tier1`` is the CPU-scale shape (docs/environments/textcraft.md).
#: ``tier1x<K>``: exactly K distinct tier-1 targets, K in ``MULTI_TARGET_RANGE``.
MULTI_TARGET_RANGE = range(2, 13)
MULTI_TARGET: dict[str, int] = {f"tier1x{k}": k for k in MULTI_TARGET_RANGE}
#: ``nest<L>``: one target of tier L+1 whose craftable ingredients are ``NEST_BRANCHING`` ``nest<L-1>`` sub-goals.
NESTED: dict[str, int] = {"nest1": 1, "nest2": 2}
NEST_BRANCHING = 2
DIFFICULTIES: dict[str, tuple[int, int]] = {"tier1": (1, 1), **{d: (1, 1) for d in MULTI_TARGET},
                                            **{d: (lv + 1, lv + 1) for d, lv in NESTED.items()},
                                            **PAPER_DIFFICULTIES}
VALIDATION_FRACTION = 0.2
ENV_NAME = "textcraft-synth"
#: Bounds of the generator's graph options: ``items_per_tier`` items per domain and tier (13 tiers, 5 domains),
#: at least 4 (recipes need distinct ingredients), at most 400 (about 27k items, 0.25 s to build; the default 25
#: has 1.7k). Unbounded, 10^6 would ask for 65M items.
MIN_ITEMS_PER_TIER, MAX_ITEMS_PER_TIER = 4, 400


def plan_crafts(graph: RecipeGraph, targets: dict[str, int], leaves: frozenset[str] | set[str] = frozenset(),
                held: dict[str, int] | None = None) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Aggregated crafting plan for ``targets``, from scratch unless ``held`` is given.

    Every craftable item needed is crafted in one batch of ``ceil(need / result_count)`` executions,
    needs being summed over all uses before rounding (items processed from the highest tier down, a
    valid topological order since ingredients always sit at lower tiers). Items in ``leaves`` are not
    expanded (e.g. items delegated to sub-agents). ``held`` intermediates are used before crafting more,
    except a target's own count (targets must be crafted anew); held base items are not subtracted.

    Returns:
        (crafts, leaf_needs): crafts in crafting order (lowest tier first), each
        ``{"item", "executions", "total", "ingredients"}`` with ``ingredients`` = recipe x executions;
        leaf_needs = {item: units} of base items and ``leaves`` items consumed.
    """
    need = dict(targets)
    crafts: list[dict[str, Any]] = []
    leaf_needs: dict[str, int] = {}
    done: set[str] = set()
    while True:
        pending = [i for i in need if i not in done]
        if not pending:
            break
        item = max(pending, key=lambda i: (graph.tier[i], i))
        done.add(item)
        n = need[item]
        if graph.is_base(item) or (item in leaves and item not in targets):
            leaf_needs[item] = leaf_needs.get(item, 0) + n
            continue
        n -= min(n - targets.get(item, 0), (held or {}).get(item, 0))
        if n <= 0:
            continue
        recipe = graph.recipes[item]
        execs = -(-n // recipe.result_count)
        ingredients = {i: c * execs for i, c in recipe.ingredients.items()}
        crafts.append({"item": item, "executions": execs, "total": execs * recipe.result_count,
                       "ingredients": ingredients})
        for i, c in ingredients.items():
            need[i] = need.get(i, 0) + c
    crafts.sort(key=lambda c: (graph.tier[c["item"]], c["item"]))
    return crafts, leaf_needs


_PER_UNIT: dict[tuple[int, int], dict[str, dict[str, int]]] = {}


def expanded_base_needs(graph: RecipeGraph, targets: dict[str, int]) -> dict[str, int]:
    """Base units used by the fully expanded crafting tree (one execution per unit; yields ignored)."""
    memo = _PER_UNIT.setdefault((graph.seed, graph.items_per_tier), {})

    def per_unit(item: str) -> dict[str, int]:
        if item in memo:
            return memo[item]
        if graph.is_base(item):
            out = {item: 1}
        else:
            out = {}
            for ing, c in graph.recipes[item].ingredients.items():
                for b, k in per_unit(ing).items():
                    out[b] = out.get(b, 0) + c * k
        memo[item] = out
        return out

    total: dict[str, int] = {}
    for item, count in targets.items():
        for b, k in per_unit(item).items():
            total[b] = total.get(b, 0) + k * count
    return total


def split_items(graph: RecipeGraph) -> dict[str, dict[int, list[str]]]:
    """Train / validation target items per tier (1..12): a seeded ``VALIDATION_FRACTION`` held out per tier."""
    rng = random.Random(f"textcraft-synth-split:{graph.seed}:{graph.items_per_tier}")
    out: dict[str, dict[int, list[str]]] = {"train": {}, "validation": {}}
    for tier in range(1, MAX_TIER + 1):
        items = sorted(graph.by_tier[tier])
        rng.shuffle(items)
        n_val = max(1, round(len(items) * VALIDATION_FRACTION))
        out["validation"][tier] = sorted(items[:n_val])
        out["train"][tier] = sorted(items[n_val:])
    return out


def craftable_ingredients(graph: RecipeGraph, item: str) -> list[str]:
    """The non-base ingredients of ``item``'s recipe, in recipe order (empty for a base or tier-1 item)."""
    recipe = graph.recipes.get(item)
    return [] if recipe is None else [i for i in recipe.ingredients if not graph.is_base(i)]


_NEST: dict[tuple[int, int, int], list[str]] = {}


def nest_items(graph: RecipeGraph, level: int) -> list[str]:
    """Items that are ``nest<level>`` targets, sorted; ``level`` 0 = every tier-1 item (docs/environments/textcraft.md,
    "The nested shape").

    A ``nest<L>`` item (L >= 1) has tier L+1, exactly ``NEST_BRANCHING`` craftable ingredients, each a
    ``nest<L-1>`` item, and no craftable item twice in its sub-tree.
    """
    key = (graph.seed, graph.items_per_tier, level)
    if key not in _NEST:
        if level == 0:
            _NEST[key] = sorted(graph.by_tier[1])
        else:
            below = set(nest_items(graph, level - 1))

            def subtree(item: str) -> list[str]:
                return [x for i in craftable_ingredients(graph, item) for x in (i, *subtree(i))]

            _NEST[key] = sorted(
                i for i in graph.by_tier.get(level + 1, [])
                if len(kids := craftable_ingredients(graph, i)) == NEST_BRANCHING and set(kids) <= below
                and len(set(sub := subtree(i))) == len(sub))
    return _NEST[key]


def _max_targets(difficulty: str) -> tuple[int, int]:
    # (max number of target items, max count per target)
    if difficulty in MULTI_TARGET:
        return (MULTI_TARGET[difficulty], 3)  # exactly K targets (see generate_textcraft_tasks)
    if difficulty in NESTED:
        return (1, 3)  # one nested target, 1..3 units
    if difficulty == "tier1":
        return (2, 3)  # one target (75%) or two independent ones, each one recipe from base materials
    return (1, 3) if difficulty in ("easy", "medium") else (1, 2)


@validate_call(config={"strict": True})
def generate_textcraft_tasks(
    *, n: int, seed: int, difficulty: str | None = None, split: str = "train",
    graph_seed: int = 0,
    items_per_tier: Annotated[int, Field(ge=MIN_ITEMS_PER_TIER, le=MAX_ITEMS_PER_TIER)] = 25,
) -> list[Task]:
    """``n`` seeded TextCraft-Synth tasks; same arguments, same tasks (and same bytes via write_tasks).

    Arguments are checked (types, strictly, and bounds) before anything is built: a pydantic
    ValidationError (a ValueError) names the argument, e.g. ``graph_seed: Input should be a valid integer``.

    Args:
        n: number of tasks (>= 1).
        seed: task sampling seed.
        difficulty: "easy" | "medium" | "hard" | "extreme", None / "mixed" to cycle through those four, or
            "tier1", "tier1x<K>" or "nest1" / "nest2" (CPU-scale shapes, docs/environments/textcraft.md).
        split: "train" or "validation" ("test" is treated as "validation": held-out targets).
        graph_seed: seed of the recipe graph (shared by train and validation tasks; keep it fixed).
        items_per_tier: items per domain and tier of the recipe graph, in
            [``MIN_ITEMS_PER_TIER``, ``MAX_ITEMS_PER_TIER``].

    Raises:
        ValueError: bad ``n``, ``difficulty``, ``split``, ``graph_seed`` or ``items_per_tier``.
    """
    levels = difficulty_levels(n, difficulty, DIFFICULTIES, PAPER_DIFFICULTIES)
    if split not in ("train", "validation", "test"):
        raise ValueError(f"unknown split {split!r}; expected 'train', 'validation' or 'test'")
    graph = recipe_graph(graph_seed, items_per_tier)
    pool_split = split_items(graph)["train" if split == "train" else "validation"]
    rng = random.Random(f"textcraft-synth-tasks:{seed}:{split}:{difficulty}")
    all_base = sorted(graph.by_tier[0])
    tasks: list[Task] = []
    seen: set[str] = set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        level = levels[len(tasks) % len(levels)]
        lo, hi = DIFFICULTIES[level]
        depth = rng.randint(lo, hi)
        max_targets, max_count = _max_targets(level)
        if level in NESTED:  # one target whose craftable ingredients are sub-goals one level down
            allowed = set(pool_split[depth])
            pool = [i for i in nest_items(graph, NESTED[level]) if i in allowed]
            if not pool:
                raise ValueError(f"the recipe graph (seed {graph_seed}, {items_per_tier} items per tier) has no "
                                 f"{split} {level} targets")
            targets = {rng.choice(pool): rng.randint(1, max_count)}
        elif level in MULTI_TARGET:  # K distinct sub-goals of tier 1
            items = rng.sample(pool_split[depth], max_targets)
            targets = {i: rng.randint(1, max_count) for i in items}
        else:
            n_targets = 1 if max_targets == 1 or rng.random() < 0.75 else 2
            first = rng.choice(pool_split[depth])
            targets = {first: rng.randint(1, max_count)}
            if n_targets == 2:
                other = rng.choice([i for t in range(lo, depth + 1) for i in pool_split[t] if i != first])
                targets[other] = rng.randint(1, max_count)
        key = repr(sorted(targets.items()))
        if key in seen and attempts < 20 * n:
            continue
        seen.add(key)
        needs = expanded_base_needs(graph, targets)
        inventory = {b: c + rng.randint(0, c // 2) for b, c in sorted(needs.items())}
        distractors = [b for b in all_base if b not in inventory]
        for b in rng.sample(distractors, min(len(distractors), rng.randint(1, 3))):
            inventory[b] = rng.randint(1, 5)
        crafts, _ = plan_crafts(graph, targets)
        tasks.append(Task(
            task_id=f"tcs-{split}-{level}-s{seed}-{len(tasks):05d}",
            env=ENV_NAME,
            split=split,
            difficulty=level,
            data={
                "targets": targets,
                "inventory": dict(sorted(inventory.items())),
                "depth": max(graph.tier[t] for t in targets),
                "gold_plan": crafts,
                "num_gold_crafts": len(crafts),
                "graph": {"seed": graph_seed, "items_per_tier": items_per_tier, "version": GRAPH_VERSION},
            },
        ))
    return tasks


def graph_of(task: Task) -> RecipeGraph:
    """The recipe graph a task was generated on; raises ValueError if the task lacks graph data."""
    g = task.data.get("graph")
    if not isinstance(g, dict) or "seed" not in g:
        raise ValueError(f"task {task.task_id}: data.graph (seed, items_per_tier) is missing")
    if g.get("version", GRAPH_VERSION) != GRAPH_VERSION:
        raise ValueError(f"task {task.task_id}: graph version {g.get('version')} != {GRAPH_VERSION}")
    return recipe_graph(int(g["seed"]), int(g.get("items_per_tier", 25)))
