"""Does one user's huge request hold up everyone else? `sbd serve` runs as its own process; while three
maximal requests are in flight, /health is asked every 25 ms and timed, and the server's resident
memory is sampled. Scenarios, each run with three requests at once:

- limit: a text prompt that fills the body limit (--max-body-bytes, 1 MiB by default): longer than any
  tokenization of it could fit in the prompt limit, it is refused before it is tokenized;
- longest: the longest text the server tokenizes (4 x the longest vocabulary entry x the prompt limit
  in characters), tokenized in the server's thread pool and refused for its token count;
- over: a 10 MB body (the case of an earlier test run): refused with 413 before it is read;
- decode: the longest valid requests (half the context as prompt, half as max_tokens), decoded.

    python benchmarks/serve_isolation.py --model demo --out benchmarks/results/serve_isolation.md
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx
import psutil

import sbd
from sbd.models.facts import context_limit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "sbd.cli", "serve", "--model", model, "--port", str(port),
                             "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(proc.stderr.read())
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    raise SystemExit("the server did not come up")


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def probe(url: str, pid: int, stop: threading.Event) -> tuple[list[float], float]:
    """/health latencies (ms) every 25 ms until `stop`, and the largest RSS seen (MB)."""
    times, peak = [], 0.0
    with httpx.Client(timeout=60) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                assert c.get(url + "/health").status_code == 200
            except httpx.TimeoutException:  # unanswered for a minute: counted as that long
                pass
            times.append((time.perf_counter() - t0) * 1000)
            peak = max(peak, rss_mb(pid))
            time.sleep(0.025)
    return times, peak


def scenario(url: str, pid: int, bodies: list[bytes]) -> dict:
    stop = threading.Event()
    with cf.ThreadPoolExecutor(1 + len(bodies)) as pool:
        watcher = pool.submit(probe, url, pid, stop)
        time.sleep(0.3)
        t0 = time.perf_counter()
        posts = [pool.submit(lambda b: httpx.post(url + "/v1/completions", content=b, timeout=600,
                                                  headers={"content-type": "application/json"}), b) for b in bodies]
        codes = [f.result().status_code for f in posts]
        seconds = time.perf_counter() - t0
        time.sleep(0.3)
        stop.set()
        times, peak = watcher.result()
    time.sleep(3)  # the server gives memory back in the background
    return {"codes": codes, "seconds": seconds, "p50": statistics.median(times),
            "p99": sorted(times)[int(0.99 * (len(times) - 1))], "max": max(times), "probes": len(times),
            "peak": peak, "after": rss_mb(pid)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--body-bytes", type=int, default=1 << 20, help="the server's --max-body-bytes (its default)")
    ap.add_argument("--only", default=None, help="comma-separated scenarios to run (limit, longest, over, decode)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(args.model, port)
    try:
        idle = scenario(url, proc.pid, [])
        start_rss = rss_mb(proc.pid)
        model, tokenizer = sbd.load(args.model)
        context = min(2048, context_limit(model) or 2048)  # the server's per-request length
        tokenized = 4 * max(len(k) for k in tokenizer.get_vocab()) * context  # the server's max_prompt_chars
        filler = b"Q: 12 + 7 = ? " * (args.body_bytes // 14)
        limit = b'{"prompt": "' + filler[: args.body_bytes - 40] + b'", "max_tokens": 8}'
        longest = b'{"prompt": "' + filler[:tokenized] + b'", "max_tokens": 8}'
        over = b'{"prompt": "' + b"x" * 10_000_000 + b'"}'
        half = context // 2
        decode = ('{"prompt": [%s], "max_tokens": %d, "method": "ntp"}'
                  % (", ".join(["300"] * half), context - half - 1)).encode()
        rows = [("idle (no requests)", idle)]
        scenarios = (("limit: 3 x 1 MiB text prompts (refused untokenized)", limit),
                     (f"longest: 3 x {tokenized} characters (tokenized, refused)", longest),
                     ("over: 3 x 10 MB bodies (413)", over),
                     (f"decode: 3 x ({half}-token prompt + {context - half - 1} tokens)", decode))
        for name, body in scenarios:
            if args.only is None or name.split(":")[0] in args.only.split(","):
                rows.append((name, scenario(url, proc.pid, [body] * 3)))
    finally:
        proc.send_signal(2)
        proc.wait(60)
    lines = [f"# /health under three maximal requests ({args.model}, {platform.processor() or platform.machine()}, "
             f"{psutil.cpu_count()} cores)", "",
             f"`python benchmarks/serve_isolation.py --model {args.model}`; the server as its own process "
             f"(--threads 1), RSS at start {start_rss:.0f} MB.", "",
             "| scenario | answers | seconds | /health p50 / p99 / max ms | probes | RSS peak / 3 s after MB |",
             "|---|---|---:|---:|---:|---:|"]
    for name, r in rows:
        lines.append(f"| {name} | {' '.join(map(str, r['codes'])) or '-'} | {r['seconds']:.2f} | "
                     f"{r['p50']:.1f} / {r['p99']:.1f} / {r['max']:.1f} | {r['probes']} | "
                     f"{r['peak']:.0f} / {r['after']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
