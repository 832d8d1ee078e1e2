"""The training process: the one engine, its strategies, models, loaders, checkpoints.
Imports: the shared top modules only; never ``job``, ``controller`` or ``results``.

The engine from small parts (in the spirit of torchtitan's trainer and nanoGPT's one
readable loop):

- ``run``: the one way in: an order (a run's ``SegmentOrder``, a fused pack's
  ``FusedOrder``) trained;
- ``loop``: the one training loop, for one run or K fused members: the accounting of a
  step, the agreed stop/save decision, the end of an epoch, a member leaving early; the
  hooks a framework adapter (Lightning) calls;
- ``step``: one run's step (its wrapped model and optimizer); ``fused/``: K members' step
  (``fused/step.py``) and its rooms: the fused model, optimizer, batches, hand-fused nets,
  and how a fused pack's segment is built (``fused/train.py``);
- ``segment``: a run's ledger, what one run knows (config, order, paths, progress,
  records, report);
- ``checkpoints/``: the files on disk (``files``), the resume decision as a pure function
  and the one collective that agrees on it (``resume``), a run's save, resume and publish
  (``run``), weights' digests, the weights kept;
- ``build``: seeds and RNG states, model, optimizer, schedule, batches;
- ``state``: the training ``Progress`` a checkpoint carries;
- ``meter``: the epoch meter (K sums on the device, the clock);
- ``report``: stdout, TensorBoard, the GPU sampler;
- ``stop``: the agreed stop/save decision;
- ``strategies/``: one file a strategy (cpu, gpu, ddp, mps, lightning, fsdp): inside the
  engine because the loop drives them and they build on its checkpoints and models;
- ``models``, ``loaders``, ``stage``, ``hardware``, ``gpu_monitor``, ``stop_signals``: what a
  training process needs beside its loop.

Trained in K segments or one, the weights are bit-identical: the checkpoint holds model,
optimizer, scheduler, RNG states, the position inside the epoch and the partial-epoch
sums, and the data order is a pure function of (seed, epoch). Every decision that leads
to a collective (stop, save, which checkpoint to resume) is one value agreed by all ranks.

Importing this package imports no torch: the controller and the job read light modules of
it (gpu_monitor, strategies' classes) on the login node and in every job's own Snakemake.
The engine's entry points are in its modules (``run.run_training``, ``run.run_fused``).
"""
