"""Prompt text and token bookkeeping of a node's conversation (token in, token out; docs/algorithm.md, "Loss").

The first prompt is the chat template applied to [system, goal] with a generation header. Every later
prompt is built by appending ids, never by re-tokenising earlier text:

    prompt_{k+1} = prompt_k + completion_k + ids(close_k + user_header + observation + user_end + assistant_header)

where the suffix text is cut out of the tokenizer's own chat template (rendered once with marker
strings) and only that suffix is tokenised. ``close_k`` is the template's end-of-assistant-turn text,
minus its leading special token when the completion already ended with that token (EOS stop), so the
conversation reads exactly as the template would render it.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

_A = "\u2063RAO_ASSISTANT\u2063"
_O = "\u2063RAO_OBSERVATION\u2063"
_CODE_RE = re.compile(r"```(?:python|py)[^\n]*\n(.*?)\n?```", re.DOTALL)


@functools.lru_cache(maxsize=8)
def load_tokenizer(model_path: str | Path) -> Any:
    """The checkpoint's tokenizer (``transformers.AutoTokenizer``), cached per path.

    Raises FileNotFoundError when ``model_path`` does not exist, ValueError when it has no chat template.
    """
    from transformers import AutoTokenizer

    path = Path(model_path)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer folder not found: {path}")
    tok = AutoTokenizer.from_pretrained(str(path))
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"tokenizer at {path} has no chat template")
    return tok


def extract_code(text: str) -> str | None:
    """The first complete ```python fenced block of ``text``, or None."""
    m = _CODE_RE.search(text)
    return m.group(1) if m else None


class ChatTokens:
    """Builds prompt ids for one tokenizer; see the module docstring for the rule."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        base_msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                     {"role": "assistant", "content": _A}]
        base = self._render(base_msgs, False)
        full = self._render(base_msgs + [{"role": "user", "content": _O}], True)
        if not full.startswith(base) or _A not in base or _O not in full:
            raise ValueError("the chat template does not render conversations incrementally; cannot "
                             "build token-in/token-out prompts")
        self.close_text = base[base.index(_A) + len(_A):]
        pre, post = full[len(base):].split(_O)
        self.pre_obs, self.post_obs = pre, post
        self.special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_id = eos if isinstance(eos, int) else None

    def _render(self, messages: list[dict[str, str]], gen: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without added BOS/EOS."""
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` with special tokens dropped."""
        return self.tok.decode(ids, skip_special_tokens=True)

    def initial(self, system: str, goal: str) -> list[int]:
        """[T0] ids of the first prompt: template(system, goal) + assistant header."""
        text = self._render([{"role": "system", "content": system}, {"role": "user", "content": goal}], True)
        return self.encode(text)

    def suffix(self, completion_ids: list[int], observation: str) -> list[int]:
        """Ids appended after ``completion_ids``: end of assistant turn, observation turn, header."""
        close = self.close_text
        if completion_ids and completion_ids[-1] in self.special_ids:
            last = self.tok.decode(completion_ids[-1:], skip_special_tokens=False)
            if last and close.startswith(last):
                close = close[len(last):]
        return self.encode(close + self.pre_obs + observation + self.post_obs)
