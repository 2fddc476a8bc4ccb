"""Scripted gold-path ("oracle") policy for DeepDive: searches, then follows links page by page.

It peeks at the gold path's *shape* in ``node.goal_args["oracle"]`` (start query, start page id, the
relation of every hop and the asked attribute; never the answer) and writes cells that use the tools:

- turn 0: ``search(start_query)`` and pick the start page from the printed hits;
- turn i (1..k): ``open`` the current page and read the link of relation i from its fact box
  (``- Born in: Name [page-id]``), printing the next page id;
- turn k+1: ``open`` the last page, read the attribute and ``finish`` with it.

When the walk does not fit the node's step budget (k + 2 > max_steps), or a step is repeated (an earlier
cell failed), it writes one cell that does the whole walk in a loop. Without an oracle (real DeepDive
records) it searches the question once and answers "I don't know".
"""

from __future__ import annotations

from rao_core.envs.deepdive.kg import LABELS
from rao_core.policies.base import Generation, Policy, PolicyRequest, code_message

_LINK = r"^- {label}: .*\[([a-z]+-[0-9]+)\]\s*$"
_ATTR = r"^- {label}: (.+?)\s*$"


def _rx(template: str, key: str) -> str:
    import re

    return template.format(label=re.escape(LABELS[key]))


class DeepDiveExpert(Policy):
    """Gold-path expert for ``deepdive`` tasks generated offline; see the module docstring."""

    name = "deepdive-expert"

    async def generate(self, request: PolicyRequest) -> Generation:
        """Reasoning plus one ```python cell for the node's next step (``len(node.turns)``)."""
        node = request.node
        oracle = node.goal_args.get("oracle")
        if not oracle:
            q = str(node.goal_args.get("question", node.goal))[:200]
            return code_message("I have no way to follow this question offline; I search once and abstain.",
                               f"hits = search({q!r}, num=5)\nfor h in hits:\n    print(h['id'], h['title'])\n"
                               "finish(\"I don't know\")")
        rels, attr = list(oracle["relations"]), oracle["attribute"]
        start_id, query = oracle["path"][0], oracle["start_query"]
        step, k = len(node.turns), len(rels)
        max_steps = node.max_steps or 10
        if k + 2 > max_steps or step > k + 1:
            return code_message("I will do the whole walk in one cell: search for the start, then follow the links.",
                               _one_shot(query, start_id, rels, attr))
        if step == 0:
            return code_message(f"The question starts from an entity known as {query!r}; I search for it.",
                               f"hits = search({query!r}, num=10)\nfor h in hits[:5]:\n"
                               f"    print(h['id'], '|', h['title'], '|', h['snippet'][:80])\n"
                               f"cur = next((h['id'] for h in hits if h['id'] == {start_id!r}), "
                               f"hits[0]['id'] if hits else None)\nprint('START', cur)")
        if step <= k:
            rel = rels[step - 1]
            return code_message(f"Now I open the current page and follow its '{LABELS[rel]}' link.",
                               f"import re\ntext = open(cur)\nm = re.search({_rx(_LINK, rel)!r}, text, re.M)\n"
                               f"cur = m.group(1)\nprint(text.splitlines()[1])\nprint('NEXT', cur)")
        return code_message(f"The last page should list '{LABELS[attr]}'; I read it and answer.",
                           f"import re\ntext = open(cur)\nm = re.search({_rx(_ATTR, attr)!r}, text, re.M)\n"
                           f"print(m.group(0))\nfinish(m.group(1))")


def _one_shot(query: str, start_id: str, rels: list[str], attr: str) -> str:
    return (f"import re\nhits = search({query!r}, num=10)\n"
            f"cur = next((h['id'] for h in hits if h['id'] == {start_id!r}), hits[0]['id'])\n"
            f"for rx in {[_rx(_LINK, r) for r in rels]!r}:\n"
            f"    cur = re.search(rx, open(cur), re.M).group(1)\n    print('NEXT', cur)\n"
            f"answer = re.search({_rx(_ATTR, attr)!r}, open(cur), re.M).group(1)\nprint(answer)\nfinish(answer)")
