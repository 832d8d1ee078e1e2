"""Where a run's and a pack's files live under ``results/``: the one copy of the path
templates and of the names of a segment's try logs, for the workflow (workflow.py), the
orders it sends (orders.py) and the jobs (the pack driver, tries) alike."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class RunPaths:
    results: str
    run: str

    @property
    def root(self) -> str:
        return f"{self.results}/runs/{self.run}"

    @property
    def spec(self) -> str:
        return f"{self.root}/spec.json"

    @property
    def work(self) -> str:
        """The in-segment checkpoint a killed or preempted segment resumes from."""
        return f"{self.root}/work"

    @property
    def tensorboard(self) -> str:
        return f"{self.results}/tensorboard/{self.run}"

    def segment(self, k: int) -> str:
        return f"{self.root}/segment-{k}"

    @property
    def logs(self) -> str:
        """Its training logs: segment-<k>.log, and one per try of a segment beside it."""
        return f"{self.results}/logs/train/{self.run}"

    def log(self, k: int) -> str:
        return f"{self.logs}/segment-{k}.log"

    def attempt_log(self, k: int, attempt: int, requeue: int = 0) -> str:
        """The log of one try of segment k, kept beside segment-<k>.log."""
        return f"{self.logs}/{attempt_log_name(f'segment-{k}', attempt, requeue)}"


# One try of a segment: segment-<k>.attempt<n>.log, plus .requeue<r> when Slurm requeued
# the same job (Snakemake empties the rule's log before a retry; these stay).
ATTEMPT = ".attempt{attempt}"
REQUEUE = ".requeue{requeue}"
ATTEMPT_NUMBER = re.compile(r"\.attempt(\d+)(?:\.requeue\d+)?\.log$")


def attempt_log_name(stem: str, attempt: int, requeue: int = 0) -> str:
    return (stem + ATTEMPT.format(attempt=attempt)
            + (REQUEUE.format(requeue=requeue) if requeue else "") + ".log")


def attempt_logs_pattern(stem: str, attempt: int | str = "*") -> str:
    """A glob of the try logs of `stem` (segment-<k>): of one attempt, or all (``*``)."""
    return f"{stem}{ATTEMPT.format(attempt=attempt)}.*log"


def attempt_number(name: str) -> int | None:
    found = ATTEMPT_NUMBER.search(name)
    return int(found.group(1)) if found else None


def attempt_log_sink(log: str = "{log}", attempt: str = "{resources.attempt}",
                     restarts: str = "CIFARFLOW_SLURM_RESTART_COUNT") -> str:
    """A Snakemake shell snippet, the end of a pipe: what the command prints goes, once, to
    the try's own log (attempt_log_name, built in the shell from the job's attempt and
    Slurm's restart count), and the rule's log becomes a link to it, as a pack member's
    (members.open_member_log): one file per try, not a copy in the rule's log too."""
    name = ATTEMPT.format(attempt=attempt) + f"$([ $R = 0 ] || echo {REQUEUE.format(requeue='$R')})"
    return (f"{{{{ L={log}; R=${{{{{restarts}:-0}}}}; A=${{{{L%.log}}}}{name}.log; "
            f'ln -sfn "${{{{A##*/}}}}" "$L"; cat > "$A"; }}}}')


def pack_marker(results: str, pack: str, k: int) -> str:
    """What a pack's segment job writes last: which members it trained, and how."""
    return f"{results}/packs/{pack}/segment-{k}.json"


def jobs_record(results: str) -> str:
    """The Slurm jobs this results folder's controllers submitted, and each controller that
    held the working directory's lock (slurm_queue.JobRecord)."""
    return f"{results}/controller/jobs.jsonl"


def segment_number(path) -> int | None:
    found = re.search(r"segment-(\d+)", str(path))
    return int(found.group(1)) if found else None


# sweep.search: one Optuna study per strategy, all in one journal file (a shared filesystem
# takes it: no database server); each round's trials as the controller asked them
def study_journal(results: str) -> str:
    return f"{results}/search/study.journal"


def round_record(results: str, study: str, r) -> str:
    """Round r's trials of a study (written last by the job that told round r-1 and asked
    round r); round rounds+1's record says the last round was told."""
    return f"{results}/search/{study}/round-{r}.json"
