#!/usr/bin/env python3
"""What tools cost a chat request before any token: `kwker serve`'s /tokenize of the same
messages with and without N tools (the request parsed, the tools' schemas converted and compiled
into the calls' grammar, the prompt rendered and tokenized), alternated, medians of the round
trip. Not a test: figures go to docs/benchmarks.md.

    python3 bench/tools_overhead.py [--tools 10] [--runs 50] [--format generic|hermes]
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def tool(i):
    return {"type": "function", "function": {
        "name": "tool_%d" % i, "description": "Tool number %d: does one thing well." % i,
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "maxLength": 200},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100},
            "mode": {"type": "string", "enum": ["fast", "exact", "auto"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8}},
            "required": ["query"], "additionalProperties": False}}}


def post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port)
    t0 = time.perf_counter()
    c.request("POST", "/tokenize", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    dt = time.perf_counter() - t0
    c.close()
    assert r.status == 200, data
    return dt, len(json.loads(data)["tokens"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tools", type=int, default=10)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--format", default="generic", choices=["generic", "hermes"])
    a = ap.parse_args()
    args = [str(REPO / "build" / "kwker"), "serve", "--port", "0", "--quiet"]
    if a.format == "hermes":
        data = Path(os.environ.get("KWKER_SHARED_DATA") or REPO.parent / "shared" / "data")
        args += ["--chat-template-file",
                 str(data / "chat-templates" / "llamacpp" / "Qwen-Qwen2.5-7B-Instruct.jinja")]
    log = tempfile.NamedTemporaryFile(suffix=".log")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
    try:
        for _ in range(200):
            m = re.search(r"listening on http://[^:]+:(\d+)", Path(log.name).read_text())
            if m:
                break
            time.sleep(0.1)
        port = int(m.group(1))
        msgs = [{"role": "user", "content": "Find the three newest papers on CPU inference."}]
        plain = {"messages": msgs}
        with_tools = {"messages": msgs, "tools": [tool(i) for i in range(a.tools)]}
        t_plain, t_tools = [], []
        for _ in range(3):
            post(port, plain), post(port, with_tools)
        for _ in range(a.runs):
            t_plain.append(post(port, plain))
            t_tools.append(post(port, with_tools))
        mp = statistics.median(t for t, _ in t_plain) * 1e3
        mt = statistics.median(t for t, _ in t_tools) * 1e3
        print("%s format, %d tools, %d runs alternated: /tokenize %.2f ms without tools "
              "(%d tokens), %.2f ms with (%d tokens): %.2f ms for the tools"
              % (a.format, a.tools, a.runs, mp, t_plain[0][1], mt, t_tools[0][1], mt - mp))
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())
