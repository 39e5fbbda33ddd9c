"""TorchX components: one per trainer, each returning the AppDef that components.launch builds
(a torchrun role)."""
