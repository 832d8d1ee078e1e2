"""FSDP2: ``fully_shard`` on each block, then the root; sharded checkpoints through
torch.distributed.checkpoint so no rank ever holds the whole optimizer state."""

from .ddp import DDPStrategy


class FSDPStrategy(DDPStrategy):
    name = "fsdp"
    channels_last_params = False  # inputs stay channels_last
    sharded_checkpoint = True  # checkpointer(): torch.distributed.checkpoint, a shard a rank

    def distribute(self, model):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from ..models import shard_units

        # explicit mesh: with gloo on a machine that has CUDA the default mesh would pick CUDA
        mesh = init_device_mesh("cuda" if str(self.device).startswith("cuda") else "cpu",
                                (self.world_size,))
        units = shard_units(self.unwrap(model))
        if not units and self.is_main:
            print(f"[{self.name}] {self.cfg.model} has no shard_units() and no layer1..4: sharded "
                  "as one unit (give it shard_units() to shard block by block)", flush=True)
        for unit in units:
            fully_shard(unit, mesh=mesh)
        fully_shard(self.unwrap(model), mesh=mesh)
        return model

    def sync_buffers(self, model):
        """FSDP2 shards parameters only: buffers (BatchNorm's running statistics) stay per
        rank, and the sharded checkpoint keeps one copy of each, from whichever rank. All
        ranks take rank 0's, as DDP's forward does: one model is evaluated and saved, and
        what is observed never depends on when saves happened."""
        import torch
        import torch.distributed as dist

        if self.world_size > 1:
            with torch.no_grad():
                for buffer in self.unwrap(model).buffers():
                    dist.broadcast(buffer, src=0)

    def checkpointer(self):
        from ..checkpoints.files import ShardedCheckpointer

        return ShardedCheckpointer(self)

    def _options(self):
        """Sharded state dicts: every rank saves and loads its own shards (DCP)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=False, cpu_offload=False)

    def model_state(self, model):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.unwrap(model), options=self._options())

    def load_model_state(self, model, state):
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.unwrap(model), state, options=self._options())

    def optimizer_state(self, model, optimizer):
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.unwrap(model), optimizer, options=self._options())

    def load_optimizer_state(self, model, optimizer, state):
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.unwrap(model), optimizer, state, options=self._options())
