"""A tiny OpenAI-compatible completions server (stdlib only) for runtime tests.

Usage: python fake_openai_server.py PORT DIE_AFTER [null_logprob]  -- answers POST /v1/completions with a scripted cell
(first answer: a cell printing 'hello'; later: finish('done')), echoing prompt ids; after DIE_AFTER
answers the process exits (simulating a server crash mid-rollout). With ``null_logprob`` the second
generated token's log-prob is ``null`` (a malformed answer).
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from openai_fakes import completion, send_json  # run as a script: its folder is on sys.path

PORT, DIE_AFTER = int(sys.argv[1]), int(sys.argv[2])
NULL_LOGPROB = len(sys.argv) > 3 and sys.argv[3] == "null_logprob"
COUNT = {"n": 0}
CELLS = ["```python\nprint('hello')\n```\n", "```python\nfinish('done')\n```\n"]


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if COUNT["n"] >= DIE_AFTER:
            os._exit(0)
        text = CELLS[min(COUNT["n"], len(CELLS) - 1)]
        COUNT["n"] += 1
        ids = [100 + (ord(c) % 200) for c in text]
        lps = [-0.5] * len(ids)
        if NULL_LOGPROB:
            lps[1] = None
        send_json(self, completion(body["model"], body["prompt"], text, ids, lps, list(text)))

ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
