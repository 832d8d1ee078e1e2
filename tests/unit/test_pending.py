"""ReqNodeNotAvail is two things: a node down or drained (it will not start by itself:
named, with scancel advice) and a maintenance reservation on the nodes (it starts when the
maintenance ends: named with the reservation's end, no scancel). Real squeue reasons and a
real `scontrol -o show reservation` line of the test cluster."""

from cifarflow.controller.pending import PendingWatch, maintenance_of, stuck_jobs
from cifarflow.slurm_queue import pending_of
from cifarflow.slurm import fields

RESERVATION = fields(
    "ReservationName=maint_n1 StartTime=2026-12-06T17:43:32 EndTime=2026-12-06T18:13:32 "
    "Duration=00:30:00 Nodes=n1 NodeCnt=1 CoreCnt=2 Features=(null) PartitionName=(null) "
    "Flags=MAINT,SPEC_NODES TRES=cpu=2 Users=root Groups=(null) Accounts=(null) "
    "Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)")
OTHERS = {**RESERVATION, "ReservationName": "course", "Flags": "SPEC_NODES"}  # not maintenance
PARTITIONS = {"multi": "n[1-2]", "debug": "vm"}


def job(reason, nodes="", partition="multi"):
    line = f"7|PENDING|{reason}|rule_train_cpu_wildcards_cpu_1|{partition}|{nodes}|" \
           "2026-12-06T17:40:09"
    [found] = pending_of(line, {"7"})
    return found


def waits(reason, reservations=(RESERVATION,), **kw):
    return maintenance_of(job(reason, **kw), list(reservations), PARTITIONS.get)


def test_a_maintenance_reservation_is_told_from_a_node_down_or_drained():
    until = "maintenance reservation maint_n1 on n1 until 2026-12-06T18:13:32"
    # the whole partition reserved for maintenance (Slurm says so)
    assert waits("ReqNodeNotAvail, Reserved for maintenance", partition="multi") == until
    assert waits("ReqNodeNotAvail, Reserved for maintenance", reservations=()) == \
        "a maintenance reservation"  # no record to give its end
    # Slurm names the nodes: reserved for maintenance, or down/drained
    assert waits("ReqNodeNotAvail, UnavailableNodes:n[1-2]") == until
    assert waits("ReqNodeNotAvail, UnavailableNodes:n2") is None
    assert waits("ReqNodeNotAvail, UnavailableNodes:n1", reservations=[OTHERS]) is None
    # a job asking a node (-w n1) that a maintenance holds
    assert waits("ReqNodeNotAvail, May be reserved for other job", nodes="n1") == until
    assert waits("ReqNodeNotAvail, May be reserved for other job", nodes="n2") is None
    assert waits("ReqNodeNotAvail, May be reserved for other job", partition="debug") is None


def test_a_job_waiting_for_maintenance_is_named_without_scancel():
    queue = ("7|PENDING|ReqNodeNotAvail, UnavailableNodes:n1|rule_train_cpu_wildcards_"
             "cpu_1|multi||2026-12-06T17:40:09\n"
             "8|PENDING|ReqNodeNotAvail, UnavailableNodes:n2|rule_train_cpu_wildcards_"
             "cpu_2|multi||2026-12-06T17:40:09\n")
    asked, said = [], []
    watch = PendingWatch({"7", "8"}, said.append, query=lambda: queue,
                         reservations=lambda: asked.append(1) or [RESERVATION],
                         nodes_of=PARTITIONS.get)
    assert len(watch.poll()) == 2 and watch.poll() == []
    assert asked == [1]  # once, at the look that named them; not again
    assert said == [
        "Slurm job 7 (train_cpu_wildcards_cpu_1) is pending for ReqNodeNotAvail, "
        "UnavailableNodes:n1 in partition multi: it waits for the maintenance reservation "
        "maint_n1 on n1 until 2026-12-06T18:13:32, and starts by itself when the maintenance "
        "ends",
        "Slurm job 8 (train_cpu_wildcards_cpu_2) is pending for ReqNodeNotAvail, "
        "UnavailableNodes:n2 in partition multi: a node it needs is unavailable (down, "
        "drained or reserved); it will not start by itself: scancel 8, then change the "
        "request or the partition (snakemake -n checks the plan against the partition)"]
    assert [j["maintenance"] for j in stuck_jobs(queue, {"7", "8"})] == [None, None]
