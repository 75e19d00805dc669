"""A bounded load run against `sbd serve`: requests/s, latency p50/p99, time to first token and tokens/s at
1, 4 and 16 concurrent clients, NTP against sbd-verify, on one live server in this process.

Each client streams its requests one after another (the time to first token is the first non-empty
chunk). Rounds of (clients, method) are interleaved over --repeats, so a slow moment of a shared
machine hits every configuration alike; figures are medians over the rounds. The sbd-verify answers
are checked against NTP's (greedy: they must be identical) and every failed request is counted.

    python benchmarks/serve_load.py --model demo --requests 32 --repeats 3 --out benchmarks/results/serve_load.md
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import platform
import socket
import statistics
import sys
import threading
import time

import httpx
import torch
import uvicorn

import sbd
from sbd.serving.app import ServerConfig, create_app
from sbd.tasks import make_split

DEMO_TASKS = ("chain_sum", "number_sorting", "word_sequence_reversal")


def start(app) -> tuple[uvicorn.Server, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


def one_request(client: httpx.Client, url: str, prompt: str, method: str, max_tokens: int) -> dict:
    """One streamed request; `method` may carry a block size ("sbd-verify:4"), a draft mode after "~"
    ("sbd-verify:8~adaptive") and a prefill mode after "@" (which server of the run answers it, "ntp@mixed")."""
    method = method.partition("@")[0]
    method, _, draft = method.partition("~")
    name, _, block = method.partition(":")
    body = {"prompt": prompt, "max_tokens": max_tokens, "method": name, "stream": True}
    if draft:
        body["draft"] = draft
    if block:
        body["block_size"] = int(block)
    t0 = time.perf_counter()
    first, text, tokens, ok = None, "", 0, False
    try:
        with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"ok": False}
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                piece = chunk["choices"][0]["text"]
                if piece and first is None:
                    first = time.perf_counter() - t0
                text += piece
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                    ok = True
    except httpx.HTTPError:
        return {"ok": False}
    return {"ok": ok, "latency": time.perf_counter() - t0, "ttft": first if first is not None else 0.0,
            "tokens": tokens, "text": text, "prompt": prompt}


def round_(urls: dict, prompts: list[str], clients: int, method: str, max_tokens: int) -> dict:
    """`clients` clients share the prompt list, each sending its next request when the last one ended."""
    url = urls[method.partition("@")[2] or "separate"]
    queue = list(prompts)
    lock = threading.Lock()
    results = []

    def client_loop():
        with httpx.Client(timeout=600) as c:
            while True:
                with lock:
                    if not queue:
                        return
                    p = queue.pop(0)
                results.append(one_request(c, url, p, method, max_tokens))

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client_loop) for _ in range(clients)]:
            f.result()
    wall = time.perf_counter() - t0
    good = [r for r in results if r["ok"]]
    lat = sorted(r["latency"] for r in good)
    return {"wall": wall, "failed": len(results) - len(good), "requests_per_s": len(good) / wall,
            "p50": lat[len(lat) // 2] if lat else float("nan"),
            "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan"),
            "ttft": statistics.median(r["ttft"] for r in good) if good else float("nan"),
            "tokens_per_s": sum(r["tokens"] for r in good) / wall, "answers": {r["prompt"]: r["text"] for r in good}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--requests", type=int, default=32, help="requests per round (default: 32)")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--methods", default="ntp,sbd-verify",
                    help="comma-separated; method:BLOCK sets a block size (sbd-verify:4), ~adaptive the draft mode, @mixed the newcomers' "
                         "prefill inside the shared forward (ntp@mixed; default @separate); the first is the baseline")
    ap.add_argument("--max-tokens", type=int, default=112)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = sbd.load(args.model)
    per_task = -(-args.requests // len(DEMO_TASKS))
    prompts = [ex["prompt"] for t in DEMO_TASKS for ex in make_split(t, "test", per_task)][: args.requests]
    clients = [int(c) for c in args.clients.split(",")]
    methods = args.methods.split(",")
    servers, urls = [], {}
    for mode in sorted({m.partition("@")[2] or "separate" for m in methods}):  # one server per prefill mode
        app = create_app(model, tokenizer, ServerConfig(model_name=args.model, max_batch=args.max_batch,
                                                         max_queue=1024, prefill=mode))
        server, urls[mode] = start(app)
        servers.append(server)
    runs: dict = {}
    for m in methods:
        round_(urls, prompts[:4], 2, m, args.max_tokens)  # warm-up
    for rep in range(args.repeats):
        for c in clients:
            for m in methods:
                r = round_(urls, prompts, c, m, args.max_tokens)
                runs.setdefault((c, m), []).append(r)
                print(f"repeat {rep + 1} clients {c:>2} {m:<10} {r['tokens_per_s']:7.1f} tok/s  "
                      f"{r['requests_per_s']:5.2f} req/s  failed {r['failed']}", flush=True)
    for server in servers:
        server.should_exit = True
    lines = [
        "# sbd serve under load",
        "",
        f"Command: `python benchmarks/serve_load.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
        "",
        f"One live server in the benchmark's process (uvicorn, 127.0.0.1), model {args.model}, engine of "
        f"{args.max_batch} rows, greedy, max_tokens {args.max_tokens}; {len(prompts)} held-out prompts per round "
        f"({', '.join(DEMO_TASKS)}), each client streaming one request after another; rounds of (clients, method) "
        f"interleaved over {args.repeats} repeats, medians. Device: {platform.machine()} CPU, {args.threads} torch "
        f"threads, torch {torch.__version__}.",
        "",
        "| clients | method | tokens/s | vs NTP | requests/s | latency p50 s | latency p99 s | TTFT p50 s | failed | "
        "same answers as NTP |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in clients:
        base = statistics.median(r["tokens_per_s"] for r in runs[(c, methods[0])])
        for m in methods:
            rs = runs[(c, m)]
            med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
            ref = runs[(c, methods[0])][0]["answers"]
            same = sum(rs[0]["answers"].get(p) == ref.get(p) for p in ref)
            lines.append(f"| {c} | {m} | {med('tokens_per_s'):.1f} | {med('tokens_per_s') / base:.2f}x | "
                         f"{med('requests_per_s'):.2f} | {med('p50'):.2f} | {med('p99'):.2f} | {med('ttft'):.3f} | "
                         f"{sum(r['failed'] for r in rs)} | {same}/{len(ref)} |")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
