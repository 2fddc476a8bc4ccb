"""TextCraft-Synth environment: REPL tools over one shared inventory, exact verifier for every node.

Tools (docs/environments/textcraft.md): ``get_info(items)``, ``craft(ingredients, target)``, ``view_inventory()``;
the runtime provides ``finish`` and ``launch_subagent(targets, num_steps, context="")``, whose arguments this
module maps to a ``ChildSpec``. The :class:`TextCraftEpisode` holds ONE inventory for the whole execution tree;
each craft checks and applies its change in one synchronous step, so interleaving siblings see a consistent
inventory. Verifier (exact, every node, :meth:`TextCraftEnv.verify`): the node finished and, for every target,
(1) its shared-inventory count rose by the required units over the node's life and (2) the node's own tree (its
crafts and its descendants') made that many. Rule (2) departs from the authors' code (ApGa/platoon
``TextCraftEnv.evaluate``: (1) alone), which credits idle children with what others crafted.
Docs: docs/environments/textcraft.md.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rao_core.envs.base import (ChildSpec, Environment, Episode, Task, TaskError, ToolError, check_options, show_value,
                                tool)
from rao_core.envs.textcraft.graph import GRAPH_VERSION, RecipeGraph, recipe_graph
from rao_core.envs.textcraft.tasks import DIFFICULTIES, ENV_NAME, generate_textcraft_tasks, graph_of, plan_crafts
from rao_core.tree import EndReason, Node


class TextCraftEpisode(Episode):
    """Orchestrator-side state of one rollout: the shared inventory ({item: count > 0}) and the craft ledger.

    ``parent_of``: node id -> parent node id (None for the root), registered by ``on_node_start`` (and by a
    node's first craft). ``made``: node id -> {item: net units}, the units the crafts of that node and of
    its descendants produced minus those they consumed as ingredients (may be negative); the verifier's
    rule (2) (:meth:`TextCraftEnv.verify`).
    """

    inventory: dict[str, int] = Field(default_factory=dict)
    parent_of: dict[str, str | None] = Field(default_factory=dict)
    made: dict[str, dict[str, int]] = Field(default_factory=dict)
    graph: Any = Field(default=None, exclude=True)  # RecipeGraph (rebuilt from the task's graph seed)


def format_targets(targets: dict[str, int]) -> str:
    """``{"m3_i1": 2}`` -> ``"2 x m3_i1"`` (comma separated, in the given order)."""
    return ", ".join(f"{c} x {i}" for i, c in targets.items())


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_craftable(graph: RecipeGraph, where: str, item: Any, count: Any, what: str) -> None:
    """Raise ToolError (prefixed ``where``) unless ``item`` is a craftable item of ``graph`` and ``count``
    (called ``what``) a positive int."""
    if not isinstance(item, str) or item not in graph.tier:
        raise ToolError(f"{where}: unknown item {item!r}")
    if graph.is_base(item):
        raise ToolError(f"{where}: {item} is a base material and cannot be crafted")
    if not _is_count(count):
        raise ToolError(f"{where}: {what} must be a positive int, got {count!r}")


def base_shortfall(graph: RecipeGraph, targets: dict[str, int], inventory: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Base materials missing to craft ``targets`` from ``inventory``: {item: (units needed, units held)}.

    Needs are those of ``plan_crafts(graph, targets, held=inventory)``: the fewest executions (every item
    has one recipe), held intermediates used first except a target's own count (targets must be crafted
    anew, as the verifier counts the increase). Empty dict: the targets are craftable.
    """
    _, needs = plan_crafts(graph, targets, held=inventory)
    return {i: (n, inventory.get(i, 0)) for i, n in sorted(needs.items()) if n > inventory.get(i, 0)}


class TextCraftEnv(Environment):
    """TextCraft-Synth (``textcraft-synth``): craft target items from a tiered synthetic recipe graph."""

    name = ENV_NAME
    difficulties = (*DIFFICULTIES, "mixed")
    exact_subtask_verifier = True
    #: The cap of the delegation bonus: the authors' released TextCraft-Synth setting, 0.0 (platoon 0.4.0
    #: ``platoon/rewards.py`` ``DELEGATION_REWARD_CAP``; ApGa/platoon 01fcd20 ``train_areal_synth.py``
    #: ``_TEXTCRAFT_SYNTH_DELEGATION_REWARD_CAP``): TextCraft trains on success alone. A bonus that only roots can
    #: earn, inside a baseline shared by every depth (Eq. 4), gives solved children negative advantages;
    #: ``algo.lam: 0.4`` (97e7601's ceiling) is the option, measured in docs/experiments/stable-rao.md.
    delegation_cap = 0.0
    def extra_system_prompt(self) -> str:
        """Rules of the crafting world shown to every node."""
        return (
            "Crafting world: item names are opaque ids like `m3_i5` (domain m, tier 3). Base materials "
            "(depth 0) cannot be crafted; you only have what the inventory holds. Use get_info to read "
            "recipes before crafting; craft ingredients before the items that need them. All agents share "
            "one inventory. Call finish(message) when your targets are crafted."
        )

    # -- episode ---------------------------------------------------------------------------------------
    def new_episode(self, task: Task) -> TextCraftEpisode:
        """Fresh shared inventory from ``task.data['inventory']``; raises ValueError on malformed data."""
        inv = task.data.get("inventory")
        if not isinstance(inv, dict) or not all(_is_count(v) or v == 0 for v in inv.values()):
            raise ValueError(f"task {task.task_id}: data.inventory must be {{item: count >= 0}}")
        graph = graph_of(task)
        unknown = [i for i in inv if i not in graph.tier]
        if unknown:
            raise ValueError(f"task {task.task_id}: inventory items not in the recipe graph: {unknown[:5]}")
        return TextCraftEpisode(task=task, inventory={k: v for k, v in inv.items() if v > 0}, graph=graph)

    def validate_task(self, task: Task) -> None:
        """Check ``data.graph``, ``data.inventory`` and ``data.targets`` before any rollout.

        Raises TaskError for: a missing or malformed graph ({"seed": int, "items_per_tier": int >= 4,
        "version": GRAPH_VERSION}); an inventory that is not {known item: int >= 0}; targets that are not
        a non-empty {known craftable item: int > 0}; targets that cannot be crafted from the inventory
        (base units short after using held intermediates; see ``base_shortfall``).
        """
        d = task.data
        g = d.get("graph")
        graph_expected = f"{{'seed': int, 'items_per_tier': int >= 4, 'version': {GRAPH_VERSION}}}"
        if not isinstance(g, dict):
            raise TaskError("data.graph", f"got {show_value(g)}", graph_expected)
        for key, default, lo in (("seed", None, None), ("items_per_tier", 25, 4)):
            v = g.get(key, default)
            if not _is_int(v) or (lo is not None and not lo <= v <= 1000):
                raise TaskError(f"data.graph.{key}", f"got {show_value(v)}",
                                "an int" + (f" in {lo}..1000" if lo is not None else ""))
        if g.get("version", GRAPH_VERSION) != GRAPH_VERSION:
            raise TaskError("data.graph.version", f"got {show_value(g.get('version'))}",
                            f"{GRAPH_VERSION} (regenerate the tasks)")
        graph = recipe_graph(g["seed"], g.get("items_per_tier", 25))
        known = f"an item of the recipe graph (seed {g['seed']}), like {min(graph.by_tier[0])}"
        inv = d.get("inventory")
        if not isinstance(inv, dict):
            raise TaskError("data.inventory", f"got {show_value(inv)}", "a dict {item: count >= 0}")
        for item, count in inv.items():
            if item not in graph.tier:
                raise TaskError(f"data.inventory.{item}", f"unknown item {item!r}", known)
            if not (_is_int(count) and count >= 0):
                raise TaskError(f"data.inventory.{item}", f"count {show_value(count)}", "an int >= 0")
        targets = d.get("targets")
        if not isinstance(targets, dict) or not targets:
            raise TaskError("data.targets", f"got {show_value(targets)}", "a non-empty dict {item: count > 0}")
        for item, count in targets.items():
            if item not in graph.tier:
                raise TaskError(f"data.targets.{item}", f"unknown item {item!r}",
                                f"a craftable item of the recipe graph (seed {g['seed']}), like {min(graph.by_tier[1])}")
            if graph.is_base(item):
                raise TaskError(f"data.targets.{item}", f"{item} is a base material (cannot be crafted)",
                                "a craftable item (tier >= 1)")
            if not _is_count(count):
                raise TaskError(f"data.targets.{item}", f"count {show_value(count)}", "an int > 0")
        short = base_shortfall(graph, targets, inv)
        if short:
            detail = ", ".join(f"{i} (need {n}, have {h})" for i, (n, h) in list(short.items())[:3])
            raise TaskError("data.targets", f"cannot be crafted from data.inventory: short of {detail}",
                            "targets craftable from the starting inventory")

    def root_goal(self, task: Task) -> ChildSpec:
        """Goal text listing the task's targets; ``goal_args = {"targets": {...}}``."""
        targets = self._check_targets(task.data.get("targets"), graph_of(task), where=f"task {task.task_id}")
        return ChildSpec(goal=self.goal_text(targets), goal_args={"targets": targets})

    @staticmethod
    def goal_text(targets: dict[str, int], context: str = "") -> str:
        """The natural-language goal of a node crafting ``targets`` (plus the parent's context, if any)."""
        text = (f"Craft these items into the shared inventory: {format_targets(targets)}. You succeed when "
                "your inventory holds at least that many more of each item than when you started, and you "
                "have called finish(message).")
        if context:
            text += f"\n\nContext from the parent agent:\n{context}"
        return text

    def _check_targets(self, targets: Any, graph: RecipeGraph, where: str = "launch_subagent") -> dict[str, int]:
        if not isinstance(targets, dict) or not targets:
            raise ToolError(f"{where}: targets must be a non-empty dict {{item: count}}, got {targets!r}")
        out: dict[str, int] = {}
        for item, count in targets.items():
            _check_craftable(graph, where, item, count, f"count of {item}")
            out[item] = count
        return out

    def launch_subagent(self, episode: TextCraftEpisode, targets: dict, num_steps: int,
                        context: str = '') -> ChildSpec:
        """Start a sub-agent with a fresh context whose goal is to craft `targets` ({item: count}) into the SAME
        shared inventory within `num_steps` steps; `context` is optional extra text for it (e.g. recipes you
        already know). Returns the sub-agent's finish() message. Await it; run independent sub-agents at
        once with `await asyncio.gather(launch_subagent(...), launch_subagent(...))`. A sub-agent succeeds
        only if it crafts its targets and calls finish."""
        targets = self._check_targets(targets, episode.graph)
        if not _is_count(num_steps):
            raise ToolError(f"launch_subagent: num_steps must be a positive int, got {num_steps!r}")
        context = context or ""
        if not isinstance(context, str):
            raise ToolError(f"launch_subagent: context must be a string, got {type(context).__name__}")
        return ChildSpec(goal=self.goal_text(targets, context), goal_args={"targets": targets, "context": context},
                         max_steps=num_steps)

    def bonus_exclusion(self, episode: Episode, parent: Node, child: ChildSpec) -> str | None:
        """Why ``child`` earns ``parent`` no delegation bonus (``algo.bonus: useful``), or None.

        Exact, from the structured goals and the recipe graph: a child whose targets cover all of the
        parent's targets (each at least the parent's count) forwards the parent's goal; a child asking for an
        item that is neither one of the parent's targets nor an ingredient, at any depth, of one of them is
        not part of the parent's goal (padding). A child crafting a strict part of the job is credited.

        This verdict covers what a child is ASKED to do; what it DID is the verifier's: a credited child
        earns the bonus only when its own success is 1, and ``verify`` counts only what the child's own tree
        crafted, so children launched on parts of the goal that then idle while the parent crafts earn
        nothing (:meth:`verify`).
        """
        assert isinstance(episode, TextCraftEpisode)
        own: dict[str, int] = parent.goal_args.get("targets") or {}
        sub: dict[str, int] = child.goal_args.get("targets") or {}
        if not own or not sub:
            return None
        if all(sub.get(i, 0) >= c for i, c in own.items()):
            return "forwards its parent's goal (all of its targets)"
        needed, todo = set(own), list(own)
        while todo:
            recipe = episode.graph.recipes.get(todo.pop())
            for ing in recipe.ingredients if recipe else ():
                if ing not in needed:
                    needed.add(ing)
                    todo.append(ing)
        outside = [i for i in sub if i not in needed]
        return f"not part of its parent's goal ({', '.join(outside)})" if outside else None

    @staticmethod
    def _target_counts(episode: TextCraftEpisode, node: Node) -> dict[str, int]:
        return {i: episode.inventory.get(i, 0) for i in node.goal_args.get("targets") or {}}

    @staticmethod
    def _made_counts(episode: TextCraftEpisode, node: Node) -> dict[str, int]:
        made = episode.made.get(node.node_id, {})
        return {i: made.get(i, 0) for i in node.goal_args.get("targets") or {}}

    @staticmethod
    def _book(episode: TextCraftEpisode, node: Node | None, delta: dict[str, int]) -> None:
        """Add one craft's inventory change ``delta`` ({item: +produced / -consumed units}) to the ledger
        ``episode.made`` of ``node`` and of each of its ancestors (walked through ``episode.parent_of``). A
        craft with no node (a direct call outside a rollout) is booked to nobody."""
        if node is None:
            return
        episode.parent_of.setdefault(node.node_id, node.parent_id)
        nid: str | None = node.node_id
        seen: set[str] = set()
        while nid is not None and nid not in seen:
            seen.add(nid)
            book = episode.made.setdefault(nid, {})
            for item, d in delta.items():
                book[item] = book.get(item, 0) + d
            nid = episode.parent_of.get(nid)

    def on_node_start(self, episode: TextCraftEpisode, node: Node) -> None:
        """Register the node's parent in ``episode.parent_of`` (so its crafts are booked up the tree) and
        snapshot its target counts into ``node.env_info["start_counts"]``."""
        episode.parent_of[node.node_id] = node.parent_id
        node.env_info["start_counts"] = self._target_counts(episode, node)

    def on_node_end(self, episode: TextCraftEpisode, node: Node) -> None:
        """Snapshot the node's target counts into ``node.env_info["end_counts"]`` and the net units of each
        target its own tree crafted (its crafts and its descendants') into ``node.env_info["made_counts"]``."""
        node.env_info["end_counts"] = self._target_counts(episode, node)
        node.env_info["made_counts"] = self._made_counts(episode, node)

    # -- tools -----------------------------------------------------------------------------------------
    @tool
    def get_info(self, episode: TextCraftEpisode, items: list[str]) -> list[dict]:
        """For each item: whether it is craftable or a base material, how many you hold, its crafting depth,
        and its recipes as {'ingredients': {item: count}, 'result_count': n} (one execution consumes the
        ingredients and yields result_count items)."""
        if isinstance(items, str):
            items = [items]
        if not isinstance(items, (list, tuple)) or not items or not all(isinstance(i, str) for i in items):
            raise ToolError(f"get_info(items): items must be a list of item names, got {items!r}")
        unknown = [i for i in items if i not in episode.graph.tier]
        if unknown:
            raise ToolError(f"get_info: unknown item(s): {', '.join(map(repr, unknown))}")
        return [episode.graph.info(i, episode.inventory.get(i, 0)) for i in dict.fromkeys(items)]

    @tool
    def craft(self, episode: TextCraftEpisode, node: Node | None, ingredients: dict, target: tuple) -> str:
        """Craft target=(item, total). `total` must be a multiple of the recipe's result_count and
        `ingredients` exactly the recipe's ingredients times total/result_count. Consumes the ingredients from
        the shared inventory and adds `total` of the item."""
        # (not shown to the policy) the change is also booked to ``node`` and its ancestors, ``_book``
        ep, g = episode, episode.graph
        if not (isinstance(target, (list, tuple)) and len(target) == 2):
            raise ToolError(f"craft: target must be a pair (item, total), got {target!r}")
        item, total = target
        _check_craftable(g, "craft", item, total, "target total")
        recipe = g.recipes[item]
        if total % recipe.result_count:
            raise ToolError(f"craft: {item} is made {recipe.result_count} at a time; total {total} is not a "
                            f"multiple of {recipe.result_count}")
        k = total // recipe.result_count
        expected = {i: c * k for i, c in recipe.ingredients.items()}
        if not isinstance(ingredients, dict) or {str(i): c for i, c in ingredients.items()} != expected:
            raise ToolError(f"craft: wrong ingredients for {total} x {item} ({k} execution(s) of "
                            f"{dict(recipe.ingredients)} -> {recipe.result_count}); expected exactly {expected}, "
                            f"got {ingredients!r}")
        short = {i: (c, ep.inventory.get(i, 0)) for i, c in expected.items() if ep.inventory.get(i, 0) < c}
        if short:
            detail = ", ".join(f"{i} (need {c}, have {h})" for i, (c, h) in short.items())
            raise ToolError(f"craft: not enough ingredients for {total} x {item}: {detail}")
        for i, c in expected.items():  # check-then-apply with no await in between: atomic in the loop
            left = ep.inventory[i] - c
            if left:
                ep.inventory[i] = left
            else:
                del ep.inventory[i]
        ep.inventory[item] = ep.inventory.get(item, 0) + total
        self._book(ep, node, {**{i: -c for i, c in expected.items()}, item: total})
        return f"Crafted {total} x {item} (now holding {ep.inventory[item]})."

    @tool
    def view_inventory(self, episode: TextCraftEpisode) -> dict:
        """The shared inventory as {item: count}."""
        return dict(sorted(episode.inventory.items()))

    # -- verification and generation -------------------------------------------------------------------
    def verify(self, episode: Episode, node: Node) -> float | None:
        """Exact success s of any node, 1.0 or 0.0 (docs/environments/textcraft.md, "Verifier").

        1.0 iff ``node`` ended by ``finish`` and for every target ``item: required`` (units): (1) its
        shared-inventory count rose by >= required over the node's life (``env_info`` start and end
        counts), and (2) the node's own tree, its crafts and its descendants' crafts, made >= required net
        units of it (``env_info["made_counts"]``); crafts by its parent, siblings or other branches never
        count (a departure from the authors' final-minus-initial check). Descendants' crafts do count: they are
        work the node obtained by delegating, and scoring a middle node that split its goal among its own
        sub-agents 0 would penalise the recursion the method trains. Without the end snapshots (the runtime never
        called ``on_node_end``), today's inventory and ledger are read.

        Raises:
            ValueError: the node has no targets, or ``on_node_start`` never ran for it (no start counts).
        """
        assert isinstance(episode, TextCraftEpisode)
        if node.end_reason != EndReason.FINISHED:
            return 0.0
        targets = node.goal_args.get("targets") or {}
        if not targets:
            raise ValueError(f"node {node.node_id}: goal_args has no targets; cannot verify")
        start = node.env_info.get("start_counts")
        if start is None:
            raise ValueError(f"node {node.node_id}: env_info.start_counts missing (on_node_start not called)")
        end = node.env_info.get("end_counts") or self._target_counts(episode, node)
        made = node.env_info.get("made_counts")
        if made is None:
            made = self._made_counts(episode, node)
        rose = all(end.get(i, 0) - start.get(i, 0) >= c for i, c in targets.items())
        own = all(made.get(i, 0) >= c for i, c in targets.items())
        return 1.0 if rose and own else 0.0

    def generate_tasks(self, *, n: int, seed: int, difficulty: str | None = None, split: str = "train",
                       **options: Any) -> list[Task]:
        """Seeded tasks; options: ``graph_seed`` (0), ``items_per_tier`` (25). See ``generate_textcraft_tasks``."""
        check_options(self.name, options, ("graph_seed", "items_per_tier"))
        return generate_textcraft_tasks(n=n, seed=seed, difficulty=difficulty, split=split, **options)
