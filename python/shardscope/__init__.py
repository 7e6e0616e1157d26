"""ShardScope for Python training runs.

``shardscope.deepspeed`` attaches the ShardScope inspector to a real DeepSpeed ZeRO-3 run:
each rank process serves the same endpoint our own engine serves, so ``shardscope`` (the
GUI) and ``shardscope-capture`` attach to it as to ``shardscope-train``. ``shardscope.fsdp``
does the same for PyTorch FSDP2 (``fully_shard``).
"""

__all__ = ["deepspeed", "fsdp", "ShardScopeError", "UnregisteredAccessError"]


class ShardScopeError(RuntimeError):
    """The agent cannot do what was asked; the message says what to do instead."""


class UnregisteredAccessError(ShardScopeError):
    """Raised under ``guard="error"`` at the first unregistered access.

    ``fix`` holds the line that fixes it, e.g.
    ``deepspeed.zero.register_external_parameter(model.lm_head, model.embed.weight)``.
    """

    def __init__(self, message, fix):
        super().__init__(message if not fix else f"{message}\n    fix: {fix}")
        self.fix = fix
