"""Which GPU type a GPU job asks for where resources.gpu_model leaves it open: the type the
nodes have, from the partitions read at `snakemake -n` (partitions.py; no other Slurm
query), as Alliance asks (a typed ``--gpus-per-node=h100:1``: an untyped request may be
refused or land on any GPU). ``any`` opts out. No torch here."""

from __future__ import annotations

from .gpu_limits import MIG_SLICE, job_gpus
from .routing import candidates

ANY = "any"  # resources.gpu_model: ask for a GPU of any type (untyped)


def node_types(partitions: dict[str, dict], named: str) -> dict[str, int]:
    """The GPUs by type of the nodes a GPU job may run on (untyped ones left out)."""
    nodes = {node["name"]: node for partition in candidates(partitions, named, True)[0]
             for node in partition["nodes"]}  # a node of several partitions counts once
    counts: dict[str, int] = {}
    for node in nodes.values():
        for model, count in node["gpu_types"].items():
            if model:
                counts[model] = counts.get(model, 0) + count
    return counts


def settle_gpu_type(partitions: dict[str, dict] | None, named: str,
                    gpu_model: str) -> tuple[str, str]:
    """(the type to ask where the config names none, "" for an untyped request; a line for
    `snakemake -n`). Of several types, the whole-GPU type (not a MIG slice) with the most
    GPUs where GPU jobs go, ties by name: deterministic, said, and overridden by naming one."""
    if gpu_model and gpu_model != ANY:
        return "", ""  # the config's own (routing.py refuses a type the nodes lack)
    if gpu_model == ANY:
        return "", ("GPU type: any (resources.gpu_model: any): GPU jobs ask "
                    "--gpus-per-node=<n>, untyped")
    types = node_types(partitions or {}, named)
    if not types:
        return "", ("GPU type: none declared by the GPU nodes (Gres gpu:<n>), or Slurm did not "
                    "tell: GPU jobs ask --gpus-per-node=<n>, untyped")
    whole = {t: n for t, n in types.items() if not MIG_SLICE.search(t)} or types
    chosen = sorted(whole, key=lambda t: (-whole[t], t))[0]
    listed = ", ".join(f"{t}:{n}" for t, n in sorted(types.items(), key=lambda i: (-i[1], i[0])))
    why = ("the type of the GPU nodes" if len(types) == 1 else
           "of several, the whole-GPU type with the most GPUs where GPU jobs go")
    return chosen, (f"GPU type: {chosen} ({why}: {listed}): GPU jobs ask "
                    f"--gpus-per-node={chosen}:<n>; resources.gpu_model names another type, "
                    f"{ANY} asks for any")


def typed_shapes(shapes: dict[str, dict], gpu_type: str) -> dict[str, dict]:
    """The plan's job shapes with the settled type where a GPU job names none."""
    if not gpu_type:
        return shapes
    return {job: ({**shape, "gpu_model": gpu_type}
                  if job_gpus(shape) and not shape.get("gpu_model") else shape)
            for job, shape in shapes.items()}
