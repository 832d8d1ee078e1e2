"""What a plan will hold under results/: files, directories and bytes, said at `snakemake
-n` and compared with the filesystem under results: (quota.py), so a sweep is sized against
a /project or /scratch quota before it runs. No torch here: the registered models' sizes
are on their cards (model_cards.py); a user's ``module:factory`` model is counted from the
one check_user_models built.

Counted per run, per segment and per try as the rules and the engine write them (layout.py;
tests/integration/test_storage_count.py holds the count to a real run's files): one try per
segment (a retry adds TRY_FILES), the planned segments (segments.max_extra adds more only
where a segment falls short)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model_cards import card_of

# optimizer state per parameter: SGD with momentum keeps one buffer, Adam two
OPTIMIZER_SLOTS = {"sgd": 1, "adam": 2}
# a run's own: runs/<run>/ with spec.json and tries.jsonl, its work/ (the in-segment
# checkpoint, while a segment trains), and its folders under logs/train, benchmarks/train,
# tensorboard
RUN_DIRS, RUN_FILES = 5, 2
# a segment's directory (segment-k/: .snakemake_timestamp, checkpoint.json, metrics.jsonl,
# state.pt), its log link segment-k.log, its benchmark, Snakemake's .snakemake/metadata
# record of the output; FSDP over W ranks: trainer.pt and shards/ (.metadata, W .distcp)
SEGMENT_DIRS, SEGMENT_FILES = 1, 7
TRY_FILES = 2  # each try: its own log (segment-k.attemptN.log) and a TensorBoard event file
# a pack's segment job: its marker, log, benchmark and metadata record (packs/, logs/packs/,
# benchmarks/packs/ hold a folder per pack)
PACK_DIRS, PACK_SEGMENT_FILES = 3, 4
# the rest: results/'s folders, environment, logs, plots, summary, advice, their metadata
FIXED_INODES = 50
CIFAR_BYTES = 341_000_000  # the archive (163 MB) and its extracted batches (178 MB)
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
    """A checkpoint's weights and optimizer state, about; None for a model of unknown size
    (its card's sizes, or a user's model's as check_user_models measured them)."""
    sizes = card_of(model).sizes or (user_sizes or {}).get(model)
    if sizes is None:
        return None
    params, buffers = sizes
    slots = OPTIMIZER_SLOTS.get(optimizer, 2) if optimizer != "sgd" or momentum else 0
    return params * (1 + slots) + buffers


@dataclass
class Estimate:
    """What the plan holds under results/ once it has run."""
    runs: int = 0
    files: int = 0
    dirs: int = 0
    weights: int = 0        # every segment's checkpoint (keep_weights all)
    weights_last: int = 0   # the last and the best segment's of each run (keep_weights last)
    other: int = 0          # data, logs, metrics, TensorBoard
    unknown: set = field(default_factory=set)  # models of unknown size

    @property
    def inodes(self) -> int:
        return self.files + self.dirs

    def bytes(self, keep_weights: str) -> int:
        return (self.weights if keep_weights == "all" else self.weights_last) + self.other


def segment_files(run) -> tuple[int, int]:
    """(files, directories) of one segment of a run, one try."""
    if run.strategy_class.sharded_checkpoint and run.config.world_size > 1:
        return SEGMENT_FILES + 1 + run.config.world_size + TRY_FILES, SEGMENT_DIRS + 1
    return SEGMENT_FILES + TRY_FILES, SEGMENT_DIRS


def estimate(runs, packs=(), real_data: bool = True, user_sizes=None) -> Estimate:
    """Files, folders and bytes of these runs (and their packs) under results/."""
    est = Estimate(files=FIXED_INODES, other=CIFAR_BYTES if real_data else 0)
    packed = {name for pack in packs for name in pack.members}
    for run in runs:
        cfg, k = run.config, len(run.segment_epochs)
        files, dirs = segment_files(run)
        if run.name in packed:  # the pack's job has the benchmark and metadata record
            files -= 2
        est.runs += 1
        est.files += RUN_FILES + (k + 1) * files  # + the work checkpoint, as a segment's
        est.dirs += RUN_DIRS + k * dirs
        est.other += k * SMALL_BYTES_PER_SEGMENT
        size = state_bytes(cfg.model, cfg.optimizer, cfg.momentum, user_sizes)
        if size is None:
            est.unknown.add(cfg.model)
            continue
        est.weights += (k + 1) * size  # + the work checkpoint of the segment training
        est.weights_last += (min(k, 2) + 1) * size  # the last's, the best's, the work one
    for pack in packs:
        est.dirs += PACK_DIRS
        est.files += len(pack.segment_epochs) * PACK_SEGMENT_FILES
    return est


def describe(est: Estimate, keep_weights: str) -> str:
    """One line: files and bytes the plan will hold under results/, and with
    segments.keep_weights last where that is all."""
    line = (f"storage: {est.runs} run(s) will hold ~{est.files:,} files and {est.dirs:,} "
            f"folders, ~{gb(est.bytes(keep_weights))} under results/ (segments.keep_weights "
            f"{keep_weights}")
    if keep_weights == "all" and est.weights_last < est.weights:
        line += f"; last would keep ~{gb(est.bytes('last'))}"
    line += ")"
    if est.unknown:
        line += f", without the weights of {', '.join(sorted(est.unknown))}"
    return line


def gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def describe_intervals(runs) -> str:
    """One line: the in-segment checkpoint interval train.checkpoint_interval_s auto chose."""
    chosen = sorted({run.config.checkpoint_interval_s for run in runs})
    return (f"train.checkpoint_interval_s auto: in-segment checkpoints every "
            f"{' or '.join(f'{s:.0f}' for s in chosen)} s ({CHECKPOINT_INTERVAL_S:.0f} for a run "
            f"alone, longer where many train at once, so that together they write at most "
            f"~{CHECKPOINT_WRITE_MB_S:g} MB/s on average; docs/segments.md)")
