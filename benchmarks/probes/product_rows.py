"""What each extra row of x costs sbd's int4 and int8 products on this CPU: SmolLM2-135M's 210 int4 layers
(random weights of its shapes: the time depends on shapes only) and its int8 output layer, for 1-8 and 16
rows at once, on 1 and 2 threads; medians of 20 calls after 3. The multiply-adds per second show what bounds a
wide forward: one row reads the weights (memory), more rows add only multiply-adds on weights already read.

    python benchmarks/probes/product_rows.py
"""

from __future__ import annotations

import statistics
import time

import torch

LAYERS = 30
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # q·k·v joint, o, gate·up joint, down: (out, in)
HEAD = (49152, 576)


def main() -> None:
    from sbd.models import extension

    ext = extension.build()
    g = torch.Generator().manual_seed(0)

    def int4(n, k):
        return (torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g),
                (torch.rand(n, k // 32, 2, generator=g) * 0.01).half())

    body = [[int4(n, k) for n, k in SHAPES] for _ in range(LAYERS)]
    head = (torch.randint(-128, 127, HEAD, dtype=torch.int8, generator=g),
            (torch.rand(HEAD[0], HEAD[1] // 32, generator=g) * 0.01).half())
    body_macs = LAYERS * sum(n * k for n, k in SHAPES)
    print(f"torch {torch.__version__}, instruction set {['plain', 'AVX2', 'AVX-512'][ext.isa()]}")
    print("| threads | rows | int4 layers ms | int8 output layer ms | int4 G multiply-adds/s |")
    print("|---:|---:|---:|---:|---:|")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for m in (1, 2, 3, 4, 5, 8, 16):
            xs = {k: torch.randn(m, k, generator=g) for k in (576, 1536)}

            def layers():
                for layer in body:
                    for (n, k), (w, dm) in zip(SHAPES, layer):
                        ext.int4_mm(xs[k], w, dm)

            def output():
                ext.int8_mm(xs[576], *head)

            times = []
            for fn in (layers, output):
                for _ in range(3):
                    fn()
                runs = []
                for _ in range(20):
                    start = time.perf_counter()
                    fn()
                    runs.append(time.perf_counter() - start)
                times.append(statistics.median(runs))
            print(f"| {threads} | {m} | {1e3 * times[0]:.2f} | {1e3 * times[1]:.2f} | "
                  f"{m * body_macs / times[0] / 1e9:.0f} |")


if __name__ == "__main__":
    main()
