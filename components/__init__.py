"""TorchX components: one per trainer, each returning an AppDef built on ``dist.ddp``."""
