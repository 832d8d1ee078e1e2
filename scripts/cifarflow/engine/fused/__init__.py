"""The fused step's rooms: K members' model, optimizer, batches and hand-fused nets, and how
a fused pack's segment is built."""
