"""What a plan will hold under results/: files and bytes, said at `snakemake -n`, so a sweep
is sized against a /project or /scratch quota before it runs. No torch here: the registered
models' sizes are a table (tests/unit/test_storage.py holds it to the models' code); a user's
``module:factory`` model is counted from the one check_user_models built."""

from __future__ import annotations

# bytes of a registered model's parameters and of its buffers (float32)
MODEL_BYTES = {"lenet": (248_024, 0), "resnet18": (44_695_848, 38_560)}
# optimizer state per parameter: SGD with momentum keeps one buffer, Adam two
OPTIMIZER_SLOTS = {"sgd": 1, "adam": 2}
# per segment: its directory's manifest, metrics and Snakemake's time stamp (and the
# weights), the try's log and the link to it, the benchmark, a TensorBoard event file
FILES_PER_SEGMENT = 7
FILES_PER_RUN = 2  # spec.json, tries.jsonl
SMALL_BYTES_PER_SEGMENT = 20_000  # the JSON, logs and event files of a segment, about


# train.checkpoint_interval_s auto: a run alone saves every 300 s; many runs at once save so
# that together they write at most this much to the shared filesystem, on average
CHECKPOINT_INTERVAL_S = 300.0
CHECKPOINT_WRITE_MB_S = 25.0


def checkpoint_interval_s(train: dict, runs_at_once: int) -> float:
    """train.checkpoint_interval_s of one of ``runs_at_once`` runs (its train section): a
    number as set; auto: max(300 s, runs x its checkpoint's size / CHECKPOINT_WRITE_MB_S),
    a model of unknown size counted as resnet18."""
    if train["checkpoint_interval_s"] != "auto":
        return float(train["checkpoint_interval_s"])
    state = (state_bytes(train["model"], train["optimizer"], train["momentum"])
             or state_bytes("resnet18", train["optimizer"], train["momentum"]))
    return max(CHECKPOINT_INTERVAL_S, runs_at_once * state / 1e6 / CHECKPOINT_WRITE_MB_S)


def state_bytes(model: str, optimizer: str, momentum: float,
                user_sizes: dict[str, tuple[int, int]] | None = None) -> int | None:
    """A checkpoint's weights and optimizer state, about; None for a model of unknown size."""
    sizes = {**MODEL_BYTES, **(user_sizes or {})}
    if model not in sizes:
        return None
    params, buffers = sizes[model]
    slots = OPTIMIZER_SLOTS.get(optimizer, 2) if optimizer != "sgd" or momentum else 0
    return params * (1 + slots) + buffers


def describe(runs, keep_weights: str, user_sizes=None) -> str:
    """One line: files and bytes the plan's segments will hold under results/, and with
    segments.keep_weights last where that is all."""
    files = weights = weights_last = 0
    unknown = set()
    for run in runs:
        cfg, k = run.config, len(run.segment_epochs)
        files += FILES_PER_RUN + k * FILES_PER_SEGMENT
        size = state_bytes(cfg.model, cfg.optimizer, cfg.momentum, user_sizes)
        if size is None:
            unknown.add(cfg.model)
            continue
        weights += k * size
        weights_last += min(k, 2) * size  # the last segment's and the best one's
    small = sum(len(r.segment_epochs) for r in runs) * SMALL_BYTES_PER_SEGMENT
    total = weights + small if keep_weights == "all" else weights_last + small
    line = (f"storage: {len(runs)} run(s) will hold ~{files:,} files and ~{gb(total)} under "
            f"results/ (segments.keep_weights {keep_weights}")
    if keep_weights == "all" and weights_last < weights:
        line += f"; last would keep ~{gb(weights_last + small)}"
    line += ")"
    if unknown:
        line += f", without the weights of {', '.join(sorted(unknown))}"
    return line + "; put results: on /project or /scratch (docs/slurm.md)"


def gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def describe_intervals(runs) -> str:
    """One line: the in-segment checkpoint interval train.checkpoint_interval_s auto chose."""
    chosen = sorted({run.config.checkpoint_interval_s for run in runs})
    return (f"train.checkpoint_interval_s auto: in-segment checkpoints every "
            f"{' or '.join(f'{s:.0f}' for s in chosen)} s ({CHECKPOINT_INTERVAL_S:.0f} for a run "
            f"alone, longer where many train at once, so that together they write at most "
            f"~{CHECKPOINT_WRITE_MB_S:g} MB/s on average; docs/segments.md)")
