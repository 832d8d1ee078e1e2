"""The training process: the one engine, its strategies, models, loaders, checkpoints.
Imports: the shared top modules only; never ``job``, ``controller`` or ``results``.

The engine from small parts (in the spirit of torchtitan's trainer and nanoGPT's one
readable loop):

- ``segment``: the ``Segment`` loop and the hooks a framework adapter calls, ``run_training``;
- ``build``: seeds and RNG states, model, optimizer, schedule, batches;
- ``resume``: the resume decision as a pure function (a named ``Choice``), and the one
  collective that agrees on it;
- ``state``: the training ``Progress`` a checkpoint carries;
- ``meter``: the epoch meter (sums on the device, the clock);
- ``report``: stdout, TensorBoard, the GPU sampler;
- ``stop``: the agreed stop/save decision;
- ``strategies/``: one file a strategy (cpu, gpu, ddp, mps, lightning, fsdp): inside the
  engine because the segment drives them and they build on its checkpoints and models;
- ``models``, ``loaders``, ``checkpoint``, ``stage``, ``hardware``, ``gpu_monitor``,
  ``stop_signals``: what a training process needs beside its loop.

Trained in K segments or one, the weights are bit-identical: the checkpoint holds model,
optimizer, scheduler, RNG states, the position inside the epoch and the partial-epoch
sums, and the data order is a pure function of (seed, epoch). Every decision that leads
to a collective (stop, save, which checkpoint to resume) is one value agreed by all ranks.

Importing this package imports no torch: the controller and the job read light modules of
it (gpu_monitor, strategies' classes) on the login node and in every job's own Snakemake.
The engine's entry points are in its modules (``segment.run_training``, ``segment.Segment``).
"""
