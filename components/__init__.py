"""TorchX components: one per trainer, each returning an AppDef built on ``dist.torchrun``
(``dist.ddp`` on torchx 0.7.0)."""
