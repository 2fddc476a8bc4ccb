"""Scripted gold-path ("oracle") policy for ART-E: search, read the source email, answer with sources.

It peeks at ``node.goal_args["oracle"]`` (keywords that find the source email, its message ids and a
pattern locating the fact in the body; never the answer) and writes cells that use the tools:

- turn 0: ``search_emails(keywords)``, print the hits, pick the source among them;
- turn 1: ``read_email`` of that message, print it;
- turn 2: extract the fact from the printed body with the pattern and ``return_final_answer`` with the
  message id as source ("I don't know" when the pattern does not match).

Without an oracle (real questions) it searches with the question's longest words and abstains.
"""

from __future__ import annotations

import re

from rao_core.policies.base import Generation, Policy, PolicyRequest, code_message


class ArteExpert(Policy):
    """Gold-path expert for generated ``arte`` tasks; see the module docstring."""

    name = "arte-expert"

    async def generate(self, request: PolicyRequest) -> Generation:
        """Reasoning plus one ```python cell for the node's next step (``len(node.turns)``)."""
        node = request.node
        oracle = node.goal_args.get("oracle")
        step = len(node.turns)
        if not oracle:
            words = sorted(set(re.findall(r"[A-Za-z]{5,}", str(node.goal_args.get("question", node.goal)))),
                           key=len, reverse=True)[:2]
            return code_message("Without more to go on I try one search and abstain if unsure.",
                               f"hits = search_emails({words!r})\nfor h in hits:\n"
                               "    print(h['message_id'], h['subject'])\nreturn_final_answer(\"I don't know\", [])")
        kw, gold, pattern = list(oracle["keywords"]), list(oracle["message_ids"]), oracle["pattern"]
        if step == 0 or step > 2:
            return code_message(f"I search the inbox for {kw!r}.",
                               f"hits = search_emails({kw!r})\nfor h in hits:\n    print(h['message_id'], h['date'], "
                               f"h['subject'], '|', h['snippet'][:80])\n"
                               f"mid = next((h['message_id'] for h in hits if h['message_id'] in {gold!r}), "
                               f"hits[-1]['message_id'] if hits else None)\nprint('PICK', mid)")
        if step == 1:
            return code_message("The oldest matching message of the thread should hold the fact; I read it.",
                               "email = read_email(mid)\nprint(email['from'], '->', email['to'], email['cc'])\n"
                               "print(email['subject'])\nprint(email['body'])")
        return code_message("I extract the fact from the body and answer with the message as source.",
                           f"import re\nm = re.search({pattern!r}, email['body'])\n"
                           "return_final_answer(m.group(1) if m else \"I don't know\", [mid])")
