"""Offline generator of Oolong-style D&D transcripts with logged roll and spell events.

Each RL task is a synthetic session in the layout of Oolong-Real (docs/environments.md, "Oolong"): an instruction not
to guess and to answer in ``\\boxed{}``, a player-to-character mapping, then episodes of ``Name: utterance``
lines, some carrying a dice roll or a spell that the generator logs as an event; questions (families
``singledoc_rolls``, ``singledoc_spells``, ``multidoc_rolls``, ``multidoc_spells``) are answered from that log,
never from the text. The length target is in approximate tokens (``approx_tokens``), so an input can be several
times an agent's context window. Departures from Oolong-Real: transcripts are synthetic (no CRD3 text); answers
are ints, strings or comma-separated lists exactly like the real records, so ``score_answer`` applies unchanged.
Docs: docs/environments.md#oolong-oolong.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any

from rao_core.envs.base import Task, difficulty_levels

QUESTION_TYPES = ("singledoc_rolls", "singledoc_spells", "multidoc_rolls", "multidoc_spells")
PLAYERS = ("Ada", "Bram", "Cora", "Dax", "Edda", "Fenn", "Gale", "Hugo", "Iris", "Joss")
CHARACTERS = ("Thorn", "Vessa", "Korrin", "Lyra", "Mirel", "Osric", "Pell", "Quill", "Riven", "Sable",
              "Tamsin", "Ulric")
GM = "GM"
ROLL_TYPES = ("perception", "stealth", "attack", "damage", "initiative", "insight", "athletics",
              "persuasion", "investigation", "saving throw")
SPELLS = {"Fire Bolt": 0, "Eldritch Blast": 0, "Sacred Flame": 0, "Mage Hand": 0, "Cure Wounds": 1,
          "Magic Missile": 1, "Shield": 1, "Healing Word": 1, "Hold Person": 2, "Misty Step": 2,
          "Fireball": 3, "Counterspell": 3, "Polymorph": 4, "Cone of Cold": 5}
ORDINAL = {1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 5: "5th", 6: "6th", 7: "7th"}
INSTRUCTION = ("Below is a transcript of a Dungeons & Dragons campaign, split into episodes. Answer the question "
               "using only the transcript. Do not guess: count carefully. Put your final answer in \\boxed{}; "
               "give lists as comma-separated values.")
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

_GM_LINES = (
    "The corridor narrows and the torchlight flickers against wet stone.",
    "A cold wind rolls down from the mountain pass as the sun sets.",
    "The innkeeper wipes the counter and eyes the party with suspicion.",
    "You hear distant drums somewhere beneath the old temple.",
    "The merchant counts out the coins slowly, one by one.",
    "Rain hammers on the roof of the wagon as it lurches forward.",
    "The door creaks open, revealing a dusty library full of maps.",
    "Somewhere above, a bell tolls twice and then falls silent.",
    "The bandits exchange nervous glances and lower their blades.",
    "Mist gathers over the river and hides the far bank.",
    "A raven lands on the windowsill, watching every move you make.",
    "The floor is covered in strange chalk symbols, half erased.",
)
_PLAYER_LINES = (
    "I want to look around the room for anything unusual.",
    "Can we talk to the captain before we leave?",
    "I keep my hand on my sword, just in case.",
    "Let's not split the party this time, please.",
    "I ask the old woman what she knows about the tower.",
    "That sounds like a trap. I am staying back.",
    "I grab the lantern and move to the front.",
    "How far away is the bridge from here?",
    "I whisper to the others that we should hurry.",
    "I check my pack for the map we found earlier.",
    "Okay, I follow them up the stairs quietly.",
    "I would like to buy a round of drinks for everyone.",
    "Is there anyone else in the tavern right now?",
    "I try to remember where we saw that symbol before.",
)


def approx_tokens(text: str) -> int:
    """Approximate token count: words and punctuation marks (about 1.2x fewer than BPE tokens)."""
    return len(_TOKEN_RE.findall(text))


def _episode(rng: random.Random, k: int, cast: dict[str, str], budget: int, events: list[dict[str, Any]]
             ) -> list[str]:
    players = list(cast)
    lines = [f"[START OF EPISODE {k}]"]
    used = 0
    line_no = 0
    while used < budget:
        line_no += 1
        r = rng.random()
        player = rng.choice(players)
        if r < 0.35:
            text = f"{GM}: {rng.choice(_GM_LINES)}"
        elif r < 0.5:
            roll_type = rng.choice(ROLL_TYPES)
            natural = rng.random()
            if natural < 0.06:
                value, nat = 20, 20
                text = f"{player}: Natural 20 on the {roll_type}!"
            elif natural < 0.1:
                value, nat = 1, 1
                text = f"{player}: Natural 1 on the {roll_type}."
            else:
                value, nat = rng.randint(2, 28), None
                text = f"{player}: {value} for {roll_type}."
            events.append({"kind": "roll", "episode": k, "line": line_no, "player": player,
                           "character": cast[player], "roll_type": roll_type, "value": value, "natural": nat})
        elif r < 0.58:
            spell = rng.choice(sorted(SPELLS))
            base = SPELLS[spell]
            level = base
            if base > 0 and rng.random() < 0.25:
                level = min(base + rng.randint(1, 2), 7)
            text = f"{player}: I cast {spell}" + (f" at {ORDINAL[level]} level." if level != base else ".")
            events.append({"kind": "spell", "episode": k, "line": line_no, "player": player,
                           "character": cast[player], "spell": spell, "base_level": base, "level": level})
        else:
            text = f"{player}: {rng.choice(_PLAYER_LINES)}"
        lines.append(text)
        used += approx_tokens(text)
    lines.append(f"[END OF EPISODE {k}]")
    return lines


def _unique_max(counter: Counter) -> str | None:
    top = counter.most_common(2)
    if not top or (len(top) > 1 and top[0][1] == top[1][1]):
        return None
    return str(top[0][0])


def _questions(rng: random.Random, qtype: str, events: list[dict[str, Any]], episodes: list[int],
               cast: dict[str, str]) -> list[tuple[str, str]]:
    """Candidate (question, answer) pairs for ``qtype``; unanswerable templates (ties) are left out."""
    out: list[tuple[str, str]] = []
    chars = sorted(cast.values())
    if qtype.endswith("rolls"):
        rolls = [e for e in events if e["kind"] == "roll"]
        c = rng.choice(chars)
        rt = rng.choice(ROLL_TYPES)
        out += [
            ("How many dice rolls were made in total?", str(len(rolls))),
            (f"How many dice rolls did {c} make?", str(sum(e["character"] == c for e in rolls))),
            ("How many natural 20s were rolled?", str(sum(e["natural"] == 20 for e in rolls))),
            ("How many natural 1s were rolled?", str(sum(e["natural"] == 1 for e in rolls))),
            (f"What is the sum of all {rt} rolls?", str(sum(e["value"] for e in rolls if e["roll_type"] == rt))),
        ]
        if rolls:
            pct = round(100 * sum(e["natural"] == 20 for e in rolls) / len(rolls))
            out.append(("What percentage of the dice rolls were natural 20s? Round to the nearest integer.",
                        str(pct)))
        top_c = _unique_max(Counter(e["character"] for e in rolls))
        if top_c:
            out.append(("Which character made the most dice rolls?", top_c))
        top_t = _unique_max(Counter(e["roll_type"] for e in rolls))
        if top_t:
            out.append(("What was the most common type of roll?", top_t))
        if qtype.startswith("multidoc"):
            k = rng.choice(episodes)
            out.append((f"In episode {k}, how many dice rolls did {c} make?",
                        str(sum(e["character"] == c and e["episode"] == k for e in rolls))))
            top_e = _unique_max(Counter(e["episode"] for e in rolls if e["natural"] == 20))
            if top_e:
                out.append(("In which episode were the most natural 20s rolled? Answer with the episode number.",
                            top_e))
    else:
        spells = [e for e in events if e["kind"] == "spell"]
        c = rng.choice(chars)
        lvl = rng.randint(1, 3)
        n = rng.randint(2, 4)
        out += [
            ("How many spells were cast in total?", str(len(spells))),
            ("How many cantrips were cast?", str(sum(e["level"] == 0 for e in spells))),
            (f"How many spells were cast at level {lvl} or higher?", str(sum(e["level"] >= lvl for e in spells))),
            ("How many spells were upcast (cast at a higher level than their base level)?",
             str(sum(e["level"] > e["base_level"] for e in spells))),
        ]
        if len(spells) >= n:
            out.append((f"What were the first {n} spells cast, in order?", ", ".join(e["spell"] for e in spells[:n])))
            out.append((f"What were the last {n} spells cast, in order?", ", ".join(e["spell"] for e in spells[-n:])))
        mine = list(dict.fromkeys(e["spell"] for e in spells if e["character"] == c))
        if len(mine) >= 2:
            out.append((f"Which distinct spells did {c} cast? List them in the order first cast.", ", ".join(mine)))
        if qtype.startswith("multidoc"):
            k = rng.choice(episodes)
            out.append((f"How many spells were cast in episode {k}?", str(sum(e["episode"] == k for e in spells))))
    return out


def generate_oolong_tasks(*, n: int, seed: int, difficulty: str | None = None, split: str = "train",
                          target_tokens: int = 16_000, max_episodes: int = 6) -> list[Task]:
    """``n`` seeded synthetic Oolong tasks; same arguments, same tasks.

    Args:
        n: number of tasks (>= 1).
        seed: generation seed.
        difficulty: a question type (``QUESTION_TYPES``) or None / "mixed" to cycle through all four.
        split: "train" | "validation" | "test"; the split is part of the seed stream and of the campaign
            number (test 1, validation 2, train 3, as Oolong-Real's campaigns 1 and 2).
        target_tokens: transcript length target in ``approx_tokens`` (>= 200), spread over the episodes.
        max_episodes: most episodes in a multi-episode window (>= 2).

    Raises:
        ValueError: bad ``n``, ``difficulty``, ``split``, ``target_tokens`` or ``max_episodes``.
    """
    qtypes = difficulty_levels(n, difficulty, QUESTION_TYPES, QUESTION_TYPES, "Oolong question type")
    campaign = {"test": 1, "validation": 2, "train": 3}.get(split)
    if campaign is None:
        raise ValueError(f"unknown split {split!r}; expected 'train', 'validation' or 'test'")
    if target_tokens < 200:
        raise ValueError(f"target_tokens must be >= 200, got {target_tokens}")
    if max_episodes < 2:
        raise ValueError(f"max_episodes must be >= 2, got {max_episodes}")
    rng = random.Random(f"oolong-synth:{seed}:{split}:{difficulty}:{target_tokens}")
    tasks = []
    for i in range(n):
        qtype = qtypes[i % len(qtypes)]
        n_players = rng.randint(3, 5)
        players = rng.sample(PLAYERS, n_players)
        cast = dict(zip(players, rng.sample(CHARACTERS, n_players)))
        n_ep = 1 if qtype.startswith("singledoc") else rng.randint(2, max_episodes)
        first = rng.randint(1, 80)
        episodes = list(range(first, first + n_ep))
        header = [INSTRUCTION, "", "Players and their characters:"] + [f"- {p} plays {c}" for p, c in cast.items()]
        budget = max(50, (target_tokens - approx_tokens("\n".join(header))) // n_ep)
        events: list[dict[str, Any]] = []
        body: list[str] = []
        for k in episodes:
            body += _episode(rng, k, cast, budget, events)
            body.append("")
        context = "\n".join(header + [""] + body).rstrip() + "\n"
        question, answer = rng.choice(_questions(rng, qtype, events, episodes, cast))
        tasks.append(Task(
            task_id=f"oolong-synth-{split}-s{seed}-{i:05d}", env="oolong", split=split, difficulty=qtype,
            data={"source": "oolong-generator", "context": context, "question": question, "answer": answer,
                  "question_type": qtype, "episodes": episodes, "campaign": campaign, "cast": cast,
                  "events": events, "context_tokens": approx_tokens(context)},
        ))
    return tasks
