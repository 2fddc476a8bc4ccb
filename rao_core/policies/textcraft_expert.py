"""A scripted expert (oracle) policy for TextCraft-Synth that behaves like a capable REPL agent.

Stateless: every turn it re-reads the node's goal and the printed observations, never the recipe graph. Three
routes (:class:`TextCraftExpert`): the plain expert (read the recipes, delegate deep ingredients, craft the rest,
check, finish), split by sub-goal (``split_targets_min``, the ``tier1x<K>`` delegation shape: one sub-agent per
target) and recursion (``recurse``, the ``nest<L>`` shape: one sub-agent per craftable ingredient, so the
execution tree has the shape of the task's crafting tree). Its base materials stay within the task's starting
inventory (``rao_core.envs.textcraft.tasks``). Defaults match ``RuntimeConfig`` (max depth 2, 10 steps per node).
Docs: docs/environments/textcraft.md#the-nested-shape-recursion-one-level-deeper.
"""

from __future__ import annotations

import ast
import random
import re
from typing import Any

from rao_core.policies.base import Generation, Policy, PolicyRequest, code_message

_INFO_RE = re.compile(r"^INFO (\S+) depth (\d+) held (\d+) (?:base|makes (\d+) from (\{.*\}))\s*$")
_START_RE = re.compile(r"^START (\{.*\})\s*$")

_SHOW = """for r in get_info({items}):
    rec = r['recipes'][0] if r['recipes'] else None
    print('INFO', r['item'], 'depth', r['depth'], 'held', r['held'],
          'base' if rec is None else f"makes {{rec['result_count']}} from {{rec['ingredients']}}")"""

_PROGRAM = '''def explore(items, stop=()):
    info, frontier = {}, sorted(set(items))
    while frontier:
        for r in get_info(frontier):
            info[r['item']] = r
        frontier = sorted({i for r in info.values() if r['item'] not in stop for rec in r['recipes'][:1]
                           for i in rec['ingredients'] if i not in info})
    return info

def craft_from_scratch(goal, provided=(), use_held=False):
    """Craft goal {item: count} from base materials; items in `provided` are already made."""
    info = explore(goal, stop=provided)
    need, plan = dict(goal), []
    for item in sorted(info, key=lambda i: (-info[i]['depth'], i)):
        rec = info[item]['recipes'][0] if info[item]['recipes'] else None
        if item not in need or rec is None or (item in provided and item not in goal):
            continue
        n = need[item] - (info[item]['held'] if use_held and item not in goal else 0)
        if n <= 0:
            continue
        k = -(-n // rec['result_count'])
        plan.append((item, k, rec))
        for ing, c in rec['ingredients'].items():
            need[ing] = need.get(ing, 0) + c * k
    for item, k, rec in reversed(plan):
        craft({i: c * k for i, c in rec['ingredients'].items()}, (item, k * rec['result_count']))
    return len(plan)'''


def _parse_info(messages: list[dict[str, Any]]) -> tuple[dict[str, dict], dict[str, int]]:
    """Recipes read so far ({item: {"depth", "held", "yield", "ingredients"}}, first print of each item)
    and the START counts, from the observations in ``messages``."""
    info: dict[str, dict] = {}
    start: dict[str, int] = {}
    for text in (str(m.get("content", "")) for m in messages if m.get("role") != "assistant"):
        for line in text.splitlines():
            if m := _INFO_RE.match(line.strip()):
                item, depth, held, y, ings = m.groups()
                info.setdefault(item, {"depth": int(depth), "held": int(held), "yield": int(y) if y else None,
                                       "ingredients": ast.literal_eval(ings) if ings else None})
            elif (s := _START_RE.match(line.strip())) and not start:
                start = ast.literal_eval(s.group(1))
    return info, start


class TextCraftExpert(Policy):
    """Scripted TextCraft-Synth oracle (text-only generations).

    It is stateless: every turn it re-reads the node's goal (``node.goal_args["targets"]``) and the printed
    observations in ``node.messages``, and only knows what earlier cells printed (``INFO`` lines written by
    its own ``get_info`` cells). It never looks at the recipe graph. Per node (the plain expert):

    1. print ``get_info`` of the targets, then of their direct ingredients;
    2. delegate direct ingredients whose crafting depth is >= ``delegate_min_depth`` to sub-agents (when the
       node is above ``max_depth``; at most ``max_children``, deepest first), concurrently with
       ``asyncio.gather`` with probability ``parallel_prob``, else one after another;
    3. craft the rest itself: when the local sub-tree is shallow (<= ``explicit_max_depth``) and small
       (<= ``max_explicit_crafts`` crafts) it explores it level by level and writes explicit ``craft`` calls
       with names and counts read from the printed recipes; otherwise it writes a small program (explore with
       ``get_info`` in a loop, aggregate needs, craft in depth order), as a capable agent would under a
       8K-token context and a 10-step budget;
    4. checks the printed counts and calls ``finish``; on an error it runs one programmatic repair cell that
       reuses intermediates already held (its own partial work).

    Split by sub-goal (``split_targets_min``, the ``tier1x<K>`` delegation shape): a node that may delegate and
    has at least that many targets reads nothing first; its one cell snapshots the targets' counts, launches one
    sub-agent per target (``asyncio.gather`` with probability ``parallel_prob``, else a loop awaiting each),
    prints the children's results (their finish messages, kept in the REPL variable ``results``) and checks the
    counts; then it finishes (or, if a child failed, crafts what is missing itself once, as in step 4). Its
    context grows with the number of targets by one line per child.

    Recursion (``recurse``, the ``nest<L>`` nested shape; docs/environments/textcraft.md, "The expert that
    recurses"): a node that may delegate writes one cell, the same for every node but for its goal: per target
    it reads the recipe, works out one craft batch's ingredients (``need``), launches one sub-agent per
    craftable ingredient it does not hold enough of (for the shortfall; no context: the child reads its own
    recipe), then crafts the target from what the children made and the base materials (the printed
    ``Crafted N x item`` is its check). Then it finishes, or, if a target's craft did not print (a child
    failed), crafts the missing targets from scratch once, reusing what it holds. A target made from base
    materials only launches nobody. Children do the same one level down, so the execution tree has the shape of
    the task's crafting tree and each node crafts one level. A node at the depth limit, or with delegation off,
    crafts its whole sub-tree itself (steps 1-4). No sub-optimal variants on this route.

    Needs are aggregated over the node's whole local sub-tree before rounding up to recipe yields, and a node
    never relies on items it did not craft itself (siblings share the inventory), so its use of base materials
    stays within the task's starting inventory (see ``rao_core.envs.textcraft.tasks``). With
    ``suboptimal_prob`` it takes valid but longer routes (a batch split in two crafts, an extra inventory check).

    Args:
        seed: seed of the policy's own choices (wording, parallel vs sequential, sub-optimal routes).
        parallel_prob: probability of launching 2+ sub-agents with ``asyncio.gather``.
        delegate_min_depth: smallest crafting depth of an ingredient that is delegated to a sub-agent.
        max_depth: deepest node depth that may still delegate is ``max_depth - 1`` (match the runtime's).
        max_children: most sub-agents per node.
        suboptimal_prob: probability of a valid but longer route.
        explicit_max_depth: deepest local sub-tree explored and crafted with explicit calls.
        max_explicit_crafts: most explicit ``craft`` calls in one cell; beyond, a program crafts.
        child_steps: ``num_steps`` requested for each sub-agent.
        wording_variety: vary the reasoning text between equivalent phrasings.
        split_targets_min: a node that may delegate and has at least this many targets launches one
            sub-agent per target (split by sub-goal, above); 0 = never.
        recurse: a node that may delegate launches one sub-agent per craftable ingredient of its targets that it
            does not hold, then crafts its targets ("Recursion", above); ``delegate_min_depth`` is
            then not used. Takes precedence over ``split_targets_min``.
    """

    name = "textcraft-expert"

    def __init__(self, *, seed: int = 0, parallel_prob: float = 0.7, delegate_min_depth: int = 3,
                 max_depth: int = 2, max_children: int = 6, suboptimal_prob: float = 0.1,
                 explicit_max_depth: int = 3, max_explicit_crafts: int = 16, child_steps: int = 10,
                 wording_variety: bool = True, split_targets_min: int = 0, recurse: bool = False):
        if delegate_min_depth < 1 or max_depth < 0 or max_children < 0 or child_steps < 1 or split_targets_min < 0:
            raise ValueError("delegate_min_depth >= 1, max_depth >= 0, max_children >= 0, child_steps >= 1, "
                             "split_targets_min >= 0")
        for name, p in (("parallel_prob", parallel_prob), ("suboptimal_prob", suboptimal_prob)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {p}")
        self.seed, self.parallel_prob, self.delegate_min_depth = seed, parallel_prob, delegate_min_depth
        self.max_depth, self.max_children, self.suboptimal_prob = max_depth, max_children, suboptimal_prob
        self.explicit_max_depth, self.max_explicit_crafts = explicit_max_depth, max_explicit_crafts
        self.child_steps, self.wording_variety = child_steps, wording_variety
        self.split_targets_min, self.recurse = split_targets_min, recurse

    # -- helpers ---------------------------------------------------------------------------------------
    def _say(self, rng: random.Random, *options: str) -> str:
        return rng.choice(options) if self.wording_variety else options[0]

    def _plan(self, targets: dict[str, int], info: dict[str, dict], delegated: set[str]
              ) -> tuple[list[tuple[str, int, dict]], dict[str, int], set[str]]:
        """Aggregated local plan over known recipes: (crafts lowest depth first, leaf needs, unknown items)."""
        need = dict(targets)
        unknown: set[str] = set()
        plan = []
        done: set[str] = set()
        while True:
            pending = [i for i in need if i not in done]
            if not pending:
                break
            known = [i for i in pending if i in info]
            if not known:
                unknown.update(pending)
                break
            item = max(known, key=lambda i: (info[i]["depth"], i))
            done.add(item)
            r = info[item]
            if r["ingredients"] is None or (item in delegated and item not in targets):
                continue
            if r["depth"] == 1:  # ingredients of a depth-1 item are base materials: no need to look them up
                for ing in r["ingredients"]:
                    info.setdefault(ing, {"depth": 0, "held": 0, "yield": None, "ingredients": None})
            k = -(-need[item] // r["yield"])
            plan.append((item, k, r))
            for ing, c in r["ingredients"].items():
                need[ing] = need.get(ing, 0) + c * k
            unknown.update(i for i in pending if i not in info)
        unknown.update(i for i in need if i not in info)
        plan.reverse()
        return plan, need, unknown

    # -- policy ----------------------------------------------------------------------------------------
    async def generate(self, request: PolicyRequest) -> Generation:
        """The next assistant message (reasoning + one python cell) for ``request.node``."""
        node = request.node
        targets: dict[str, int] = dict(node.goal_args.get("targets") or {})
        if not targets:
            return code_message("I could not find structured targets in my goal.", 'finish("no targets given")')
        assistant_turns = [str(m.get("content", "")) for m in node.messages if m.get("role") == "assistant"]
        turn = len(assistant_turns)
        rng = random.Random(f"{self.seed}|{node.goal}|{turn}")
        info, start = _parse_info(node.messages)
        last_obs = next((str(m.get("content", "")) for m in reversed(node.messages) if m.get("role") != "assistant"),
                        "")
        tnames = list(targets)
        can_delegate = node.depth < self.max_depth and self.max_children > 0
        if self.recurse and can_delegate:
            return self._recurse_turn(targets, assistant_turns, last_obs, rng)
        if (self.split_targets_min and len(targets) >= self.split_targets_min and node.depth < self.max_depth
                and 0 < len(targets) <= self.max_children):
            return self._split_turn(targets, assistant_turns, last_obs, rng)

        # 1. recipes of the targets (and the start counts, for the final check)
        if any(t not in info for t in tnames):
            code = _SHOW.format(items=tnames) + "\nprint('START', {r['item']: r['held'] for r in get_info(%r)})" % (
                tnames,)
            return code_message(self._say(rng, f"I need to craft {', '.join(f'{c} x {i}' for i, c in targets.items())}. Let me read the recipes first.",
                                          "First I look up what these targets are made of.",
                                          "I'll start by inspecting the target items."), code)

        acted = any("# craft-phase" in t for t in assistant_turns)
        repaired = any("# repair" in t for t in assistant_turns)
        if acted:
            after = [str(m.get("content", "")) for m in node.messages if m.get("role") != "assistant"]
            ok = any("ALL-TARGETS-OK" in o for o in after[-2:])
            if not ok and not repaired:
                code = ("# repair\n" + _PROGRAM + f"\nstart = {start!r}\ngoal = {targets!r}\n"
                        "now = {r['item']: r['held'] for r in get_info(list(goal))}\n"
                        "missing = {t: c - (now[t] - start.get(t, 0)) for t, c in goal.items() "
                        "if now[t] - start.get(t, 0) < c}\n"
                        "print('missing', missing)\nif missing:\n    craft_from_scratch(missing, use_held=True)\n"
                        "now = {r['item']: r['held'] for r in get_info(list(goal))}\n"
                        "print('ALL-TARGETS-OK' if all(now[t] - start.get(t, 0) >= c for t, c in goal.items()) "
                        "else 'STILL-MISSING', now)")
                return code_message("Something went wrong; I will craft whatever is still missing from scratch.", code)
            checked = any("view_inventory()" in t for t in assistant_turns)
            if ok and not checked and "ALL-TARGETS-OK" in last_obs and rng.random() < self.suboptimal_prob:
                return code_message("Let me double-check the inventory before finishing.", "print(view_inventory())")
            done = ", ".join(f"{c} x {i}" for i, c in targets.items())
            msg = f"Crafted {done}." if ok else f"Could not craft all of {done}."
            return code_message(self._say(rng, "The targets are in the inventory, so I am done.",
                                          "Everything is crafted; finishing.", "Done crafting; reporting back.")
                                if ok else "I could not complete the targets; reporting that honestly.",
                                f"finish({msg!r})")

        # 2. direct ingredients
        direct = sorted({i for t in tnames for i in (info[t]["ingredients"] or {})})
        unknown_direct = [i for i in direct if i not in info]
        if unknown_direct:
            return code_message(self._say(rng, "Now the ingredients of my targets.",
                                          "Next I check each ingredient: base material or craftable, and how deep.",
                                          "Let me look at the ingredients one level down."),
                                _SHOW.format(items=unknown_direct))

        # 3. delegation choice (stable: depends only on the direct ingredients' info)
        cands = sorted((i for i in direct if i not in targets and info[i]["ingredients"] is not None
                        and info[i]["depth"] >= self.delegate_min_depth),
                       key=lambda i: (-info[i]["depth"], i)) if can_delegate else []
        delegated = set(cands[: self.max_children])
        plan, need, unknown = self._plan(targets, dict(info), delegated)
        local_depth = max((info[i]["depth"] for i in direct if i not in delegated), default=0)
        explicit = local_depth <= self.explicit_max_depth
        steps_left = (node.max_steps or 10) - turn
        if unknown and explicit and steps_left > 3:
            return code_message(self._say(rng, "I still need the recipes of some intermediate items.",
                                          "A few more recipes to read before I can plan the crafts.",
                                          "Reading the next level of recipes."), _SHOW.format(items=sorted(unknown)))
        programmatic = bool(unknown) or len(plan) > self.max_explicit_crafts

        lines = ["# craft-phase", "import asyncio"]
        reasons = []
        if delegated:
            calls = []
            for item in sorted(delegated, key=lambda i: (-info[i]["depth"], i)):
                r = info[item]
                ctx = f"Recipe: INFO {item} depth {r['depth']} held 0 makes {r['yield']} from {r['ingredients']}"
                calls.append(f"launch_subagent({{{item!r}: {need[item]}}}, {self.child_steps}, context={ctx!r})")
            if len(calls) > 1 and rng.random() < self.parallel_prob:
                lines.append("results = await asyncio.gather(\n    " + ",\n    ".join(calls) + ",\n)")
                reasons.append(self._say(rng, f"The {len(calls)} deep ingredients are independent, so sub-agents "
                                              "craft them in parallel.",
                                         "I delegate the deep ingredients to parallel sub-agents."))
            else:
                lines.append("results = []")
                lines += [f"results.append(await {c})" for c in calls]
                reasons.append(self._say(rng, "I hand the deep ingredients to sub-agents one after another.",
                                         "Sub-agents will make the deep ingredients, one at a time."))
            lines.append("print(results)")
        if programmatic:
            lines.append(_PROGRAM)
            lines.append(f"n = craft_from_scratch({targets!r}, provided={sorted(delegated)!r})")
            lines.append("print('crafted', n, 'batches')")
            reasons.append(self._say(rng, "The rest of the tree is large, so I write a small program that reads "
                                          "the recipes and crafts in depth order.",
                                     "I'll let code walk the remaining recipes and craft bottom-up."))
        else:
            for item, k, r in plan:
                if k >= 2 and self.suboptimal_prob and rng.random() < self.suboptimal_prob:
                    parts = [k // 2, k - k // 2]  # valid but longer: the batch in two crafts
                else:
                    parts = [k]
                for p in parts:
                    ings = {i: c * p for i, c in r["ingredients"].items()}
                    lines.append(f"print(craft({ings!r}, ({item!r}, {p * r['yield']})))")
            reasons.append(self._say(rng, "From the recipes above I craft the intermediates bottom-up, then the "
                                          "targets.", "Crafting in order, lowest depth first."))
        lines.append(f"now = {{r['item']: r['held'] for r in get_info({tnames!r})}}")
        lines.append(f"start, goal = {start!r}, {targets!r}")
        lines.append("print('ALL-TARGETS-OK' if all(now[t] - start.get(t, 0) >= c for t, c in goal.items()) "
                     "else 'STILL-MISSING', now)")
        return code_message(" ".join(reasons), "\n".join(lines))

    def _recurse_turn(self, targets: dict[str, int], assistant_turns: list[str], last_obs: str,
                      rng: random.Random) -> Generation:
        """One turn of the recursing route (:class:`TextCraftExpert`, "Recursion"): one cell that reads each target's
        recipe, launches a sub-agent per craftable ingredient not held and crafts the target; then finish, or
        repair once (craft from scratch the targets whose craft did not print)."""
        done = ", ".join(f"{c} x {i}" for i, c in targets.items())
        if not any("# craft-phase" in t for t in assistant_turns):
            lines = ["# craft-phase", f"goal = {targets!r}",
                     "for t, n in goal.items():",
                     "    r = get_info([t])[0]['recipes'][0]",
                     "    k = -(-n // r['result_count'])",
                     "    need = {i: c * k for i, c in r['ingredients'].items()}",
                     "    lack = {s['item']: need[s['item']] - s['held'] for s in get_info(list(need)) "
                     "if s['craftable'] and s['held'] < need[s['item']]}"]
            if rng.random() < self.parallel_prob:
                lines.append(f"    print(await asyncio.gather(*(launch_subagent({{i: c}}, {self.child_steps}) "
                             "for i, c in lack.items())))")
                why = self._say(rng, "One sub-agent per craftable ingredient I lack, in parallel; then I craft my "
                                     "target.",
                                "Each missing craftable ingredient is a sub-goal: sub-agents make them at once, "
                                "then I craft.")
            else:
                lines += ["    for i, c in lack.items():",
                          f"        print(await launch_subagent({{i: c}}, {self.child_steps}))"]
                why = self._say(rng, "One sub-agent per craftable ingredient I lack, one after another; then I "
                                     "craft my target.",
                                "Sub-agents make the missing craftable ingredients in turn, then I craft.")
            lines.append("    print(craft(need, (t, k * r['result_count'])))")
            return code_message(why, "\n".join(lines))
        missing = {t: c for t, c in targets.items() if not re.search(rf"Crafted \d+ x {re.escape(t)} ", last_obs)}
        repaired = any("# repair" in t for t in assistant_turns)
        ok = "REPAIRED" in last_obs if repaired else not missing
        if not ok and not repaired:
            code = ("# repair\n" + _PROGRAM + f"\ncraft_from_scratch({missing!r}, use_held=True)\n"
                    "print('REPAIRED')")
            return code_message("A craft failed; I make what is still missing myself, from scratch.", code)
        msg = f"Crafted {done}." if ok else f"Could not craft all of {done}."
        return code_message(self._say(rng, "My targets are crafted; finishing.", "Done; reporting back.")
                            if ok else "I could not complete the targets; reporting that honestly.",
                            f"finish({msg!r})")

    def _split_turn(self, targets: dict[str, int], assistant_turns: list[str], last_obs: str,
                    rng: random.Random) -> Generation:
        """One turn of the split-by-sub-goal route (:class:`TextCraftExpert`): launch, then finish or repair once."""
        check = ("now = {r['item']: r['held'] for r in get_info(list(goal))}\n"
                 "print('ALL-TARGETS-OK' if all(now[t] - start[t] >= c for t, c in goal.items()) "
                 "else 'STILL-MISSING', now)")
        done = ", ".join(f"{c} x {i}" for i, c in targets.items())
        if not any("# craft-phase" in t for t in assistant_turns):
            lines = ["# craft-phase", "import asyncio", f"goal = {targets!r}",
                     "start = {r['item']: r['held'] for r in get_info(list(goal))}"]
            if len(targets) > 1 and rng.random() < self.parallel_prob:
                lines.append(f"results = await asyncio.gather(*(launch_subagent({{t: c}}, {self.child_steps}) "
                             "for t, c in goal.items()))")
                why = self._say(rng, f"My {len(targets)} targets are independent, so one sub-agent per target "
                                     "crafts them in parallel.",
                                "Each target is its own sub-goal: I launch one sub-agent per target at once.")
            else:
                lines += ["results = []", "for t, c in goal.items():",
                          f"    results.append(await launch_subagent({{t: c}}, {self.child_steps}))"]
                why = self._say(rng, "I hand each target to its own sub-agent, one after another.",
                                "One sub-agent per target, launched in turn.")
            lines += ["print(results)", check]
            return code_message(why, "\n".join(lines))
        ok = "ALL-TARGETS-OK" in last_obs
        if not ok and not any("# repair" in t for t in assistant_turns):
            code = ("# repair\n" + _PROGRAM + "\nnow = {r['item']: r['held'] for r in get_info(list(goal))}\n"
                    "missing = {t: c - (now[t] - start[t]) for t, c in goal.items() if now[t] - start[t] < c}\n"
                    "print('missing', missing)\nif missing:\n    craft_from_scratch(missing, use_held=True)\n"
                    + check)
            return code_message("A sub-agent did not deliver; I craft what is still missing myself.", code)
        msg = f"Crafted {done}." if ok else f"Could not craft all of {done}."
        return code_message(self._say(rng, "The sub-agents delivered every target; I am done.",
                                      "All targets are in the inventory; finishing.")
                            if ok else "I could not complete the targets; reporting that honestly.",
                            f"finish({msg!r})")


__all__ = ["TextCraftExpert"]
