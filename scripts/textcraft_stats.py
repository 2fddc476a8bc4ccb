"""Measure TextCraft-Synth task statistics per difficulty (gold crafts, starting inventory) and print them.

Usage: python scripts/textcraft_stats.py [N_PER_DIFFICULTY] [SEED]. Numbers go to docs/environments/textcraft.md.
"""

from __future__ import annotations

import statistics
import sys

from rao_core.envs.textcraft import generate_textcraft_tasks

REFERENCE = {"easy": 3, "medium": 19, "hard": 87, "extreme": 170}  # median gold crafts of the reference generator


def main(n: int = 500, seed: int = 0) -> None:
    print("| difficulty | median gold crafts (ref.) | p10..p90 gold crafts | median inventory items | "
          "median inventory units |")
    print("|---|---|---|---|---|")
    for level, ref in REFERENCE.items():
        tasks = generate_textcraft_tasks(n=n, seed=seed, difficulty=level)
        crafts = sorted(len(t.data["gold_plan"]) for t in tasks)
        items = [len(t.data["inventory"]) for t in tasks]
        units = [sum(t.data["inventory"].values()) for t in tasks]
        p10, p90 = crafts[len(crafts) // 10], crafts[9 * len(crafts) // 10]
        print(f"| {level} | {statistics.median(crafts):g} ({ref}) | {p10}..{p90} | {statistics.median(items):g} | "
              f"{statistics.median(units):g} |")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
