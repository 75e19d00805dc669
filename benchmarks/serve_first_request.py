"""How long `sbd serve` takes to answer: start-up until /health says ok, then the first request and the
same request again, on a machine that has never timed the model ("new machine": an empty forward-cost
cache) and at a later start (the costs that start kept on disk).

    python benchmarks/serve_first_request.py --model smollm2 --threads 2 --out benchmarks/results/serve_first_request.md
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(port: int, model: str, max_tokens: int) -> float:
    body = json.dumps({"model": Path(model).name, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "What is 12 + 30? Answer with the number."}]})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body.encode(),
                                 headers={"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        json.loads(r.read())
    return time.perf_counter() - t


def one_start(model: str, threads: int, cache: str, max_tokens: int) -> dict:
    port = free_port()
    env = {**os.environ, "SBD_COSTS_CACHE": cache}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sbd.cli", "serve", "--model", model, "--port", str(port),
                             "--threads", str(threads)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        while True:  # poll /health: the server is up when it answers
            if proc.poll() is not None:
                raise SystemExit(f"sbd serve exited: {proc.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        start = time.perf_counter() - t0
        first, again = ask(port, model, max_tokens), ask(port, model, max_tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return {"start": start, "first": first, "again": again}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from sbd.decoding.width_cost import _cpu_name

    with tempfile.TemporaryDirectory() as cache:
        rows = {"new machine (no cost cache)": one_start(args.model, args.threads, cache, args.max_tokens),
                "later start (costs kept on disk)": one_start(args.model, args.threads, cache, args.max_tokens)}
    lines = ["# `sbd serve`: start-up and the first request", "",
             f"Command: `python {' '.join(sys.argv)}`", "",
             f"{time.strftime('%Y-%m-%d', time.gmtime())}, {_cpu_name()}, {args.threads} threads, model {args.model} "
             f"(its defaults), one chat request of {args.max_tokens} new tokens. Seconds.", "",
             "| start | until /health ok | first request | the same request again |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {r['start']:.1f} | {r['first']:.2f} | {r['again']:.2f} |" for name, r in rows.items()]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
