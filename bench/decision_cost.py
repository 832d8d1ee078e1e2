"""Cost of the agreed stop/save decision: one all-reduce (max) of two integers per batch.

Run by bench.py under torchrun with 2 gloo ranks: times ``StopController.decide`` (the
engine's own) ``--calls`` times and prints one JSON line from rank 0."""

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def main() -> None:
    import torch.distributed as dist

    from cifarflow.config import with_defaults
    from cifarflow.engine.stop import StopController
    from cifarflow.controller.plan import build_runs
    from cifarflow.engine.strategies import get_strategy

    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    cfg = build_runs(with_defaults({"strategies": ["ddp"]}))["ddp"].config
    strategy = get_strategy("ddp")(cfg, threads=1)
    strategy.setup()
    stop = StopController(None, 0.0, strategy, time.time(), interval_s=300.0)
    for _ in range(100):  # warm-up
        stop.decide(0.0, may_save=True)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        stop.decide(0.0, may_save=True)
        times.append(time.perf_counter() - t0)
    if strategy.is_main:
        print("BENCH_RESULT " + json.dumps({"calls": calls, "median_s": statistics.median(times),
                                            "p90_s": sorted(times)[int(0.9 * calls)]}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
