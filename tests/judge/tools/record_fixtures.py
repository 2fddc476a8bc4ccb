"""Record real judge answers from a served model into tests/judge/fixtures/ (for the parsing tests).

    python -m tests.judge.tools.record_fixtures BASE_URL MODEL TREES.jsonl [--n 12]

Renders the project's prompts for some TextCraft nodes (from TREES) and a few fabricated free-form nodes,
sends them at temperature 0 and 0.8, and stores messages, raw answer and the current parse of it. The
``expected`` field is what the parser returned when recorded, reviewed by hand before committing; the
test asserts the parser still gives exactly that.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import openai

from rao_core.policies.openai_policy import policy_client_key
from rao_core.judge import JudgeConfig, load_prompt, parse_verdict
from rao_core.judge.stage import judge_inputs
from rao_core.tree import EndReason, Node, read_trees

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "smollm2_135m_responses.json"

FREE_FORM = [
    ("oolong", "Count the dice rolls made by the character Vex in the transcript chunk below.", 7,
     [("rolls = [l for l in context.splitlines() if 'Vex' in l and 'roll' in l]\nprint(len(rolls))", "7")]),
    ("oolong", "List the spells cast by Scanlan in episode 3, in order.", "I could not find any spells.", []),
    ("deepdive", "Find the year the company that built the Aurora bridge was founded.", "1894",
     [("print(search('Aurora bridge builder company', 3))", "[1] Harlan & Hollingsworth built the bridge "
       "... founded 1894")]),
    ("arte", "Find the date of the board meeting mentioned by Kim in March.", "I don't know", []),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url")
    ap.add_argument("model")
    ap.add_argument("trees")
    ap.add_argument("--n", type=int, default=8, help="TextCraft nodes to use")
    a = ap.parse_args()
    cfg = JudgeConfig(base_url=a.base_url, model=a.model, max_summary_chars=1200)
    client = openai.OpenAI(base_url=a.base_url, api_key=policy_client_key(a.base_url))  # ours: RAO_POLICY_API_KEY
    items: list[tuple[str, Node]] = []
    nodes = [n for t in read_trees(a.trees) for n in t.nodes if n.verifier is not None]
    fin = [n for n in nodes if n.end_reason == EndReason.FINISHED][: a.n // 2]
    unfin = [n for n in nodes if n.end_reason != EndReason.FINISHED][: a.n - len(fin)]
    items += [("textcraft-synth", n) for n in fin + unfin]
    for i, (env, goal, result, cells) in enumerate(FREE_FORM):
        from tests.judge.conftest import node

        items.append((env, node(f"ff{i}", None, goal=goal, result=result, cells=cells)))
    records = []
    for env, n in items:
        prompt = load_prompt(env, cfg.prompt_dir)
        messages, *_ = judge_inputs(n, prompt, cfg)
        for temperature in (0.0, 0.8):
            r = client.chat.completions.create(model=a.model, messages=messages, temperature=temperature,
                                               max_tokens=cfg.max_tokens, seed=0)
            raw = r.choices[0].message.content or ""
            p = parse_verdict(raw)
            records.append({
                "env": env, "prompt_version": prompt.version, "model": a.model, "temperature": temperature,
                "truth": n.verifier, "messages": messages, "raw": raw,
                "usage": {"prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens},
                "expected": None if p is None else {"verdict": p.verdict, "how": p.how},
            })
            print(f"{env:16s} T={temperature} parsed={records[-1]['expected']} raw={raw[:100]!r}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(records)} records to {OUT}")


if __name__ == "__main__":
    main()
