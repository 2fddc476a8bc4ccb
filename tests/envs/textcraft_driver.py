"""A tiny in-process stand-in for the runtime, used to test TextCraft env + expert without sandboxes.

Each node gets a namespace whose tools call ``env.call_tool`` with JSON round-tripped arguments (as the
REPL stubs do), cells run with top-level await, prints go to the node's own buffer (sibling cells run
concurrently), observations are cut to ``obs_max`` chars, children are launched through
``env.child_spec`` and run to completion. Not a sandbox: the real runtime is ``rao_core.runtime``.
"""

from __future__ import annotations

import ast
import asyncio
import io
import json
import re
import traceback

from rao_core.policies.base import PolicyRequest, code_message
from rao_core.policies.textcraft_expert import TextCraftExpert
from rao_core.tree import EndReason, Node

_CODE = re.compile(r"```(?:python|py)[^\n]*\n(.*?)\n?```", re.DOTALL)


class FakeRuntime:
    def __init__(self, env, episode, policy, *, max_steps=10, max_depth=2, obs_max=2000, max_children=8):
        self.env, self.ep, self.policy = env, episode, policy
        self.max_steps, self.max_depth, self.obs_max, self.max_children = max_steps, max_depth, obs_max, max_children
        self.nodes: list[Node] = []

    async def run(self, task) -> Node:
        spec = self.env.root_goal(task)
        root = Node(node_id="n0", goal=spec.goal, goal_args=spec.goal_args, max_steps=self.max_steps)
        self.nodes.append(root)
        await self._run_node(root)
        return root

    async def _run_node(self, node: Node) -> None:
        env, ep = self.env, self.ep
        env.on_node_start(ep, node)
        buf = io.StringIO()
        state = {"finished": False}

        def rt(x):
            return json.loads(json.dumps(x))

        def tool(name):
            def call(*a, **k):
                a, k = rt([list(a), k])
                return rt(env.call_tool(ep, node, name, a, k))
            return call

        async def launch_subagent(*a, **k):
            if node.depth >= self.max_depth:
                raise RuntimeError("launch_subagent: maximum depth reached")
            if len(node.children) >= self.max_children:
                raise RuntimeError("launch_subagent: too many children")
            a, k = rt([list(a), k])
            spec = env.child_spec(ep, node, a, k)
            child = Node(node_id=f"n{len(self.nodes)}", parent_id=node.node_id, depth=node.depth + 1,
                         goal=spec.goal, goal_args=spec.goal_args,
                         max_steps=min(spec.max_steps or self.max_steps, self.max_steps))
            self.nodes.append(child)
            node.children.append(child.node_id)
            await self._run_node(child)
            return child.result

        def finish(message=None):
            node.result = message
            state["finished"] = True

        def _print(*a, **k):
            k.pop("file", None)
            print(*a, file=buf, **k)

        ns = {"asyncio": asyncio, "print": _print, "finish": finish, "launch_subagent": launch_subagent,
              **{t.name: tool(t.name) for t in env.tools()}}
        node.messages = [{"role": "user", "content": node.goal}]
        for _ in range(node.max_steps or self.max_steps):
            gen = await self.policy.generate(PolicyRequest(node=node, env=env.name, prompt_token_ids=[],
                                                           max_tokens=1024))
            node.messages.append({"role": "assistant", "content": gen.text})
            m = _CODE.search(gen.text)
            buf.seek(0)
            buf.truncate()
            if m is None:
                buf.write("no code cell found")
            else:
                try:
                    code = compile(m.group(1), "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                    r = eval(code, ns)
                    if asyncio.iscoroutine(r):
                        await r
                except Exception:
                    buf.write(traceback.format_exc(limit=0))
            if state["finished"]:
                break
            obs = buf.getvalue()
            if len(obs) > self.obs_max:
                obs = obs[: self.obs_max] + "\n[output truncated]"
            node.messages.append({"role": "user", "content": obs})
        node.end_reason = EndReason.FINISHED if state["finished"] else EndReason.MAX_STEPS
        env.on_node_end(ep, node)


class LazyChildren(TextCraftExpert):
    """The expert at the root; every sub-agent gives up at once (``finish('nothing')``), so the parent's
    repair path runs."""

    async def generate(self, request):
        if request.node.depth > 0:
            return code_message("I give up.", "finish('nothing')")
        return await super().generate(request)
