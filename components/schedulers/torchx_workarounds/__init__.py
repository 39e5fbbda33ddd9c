"""Every place this repository bridges what TorchX lacks, in one folder: the names TorchX keeps
private that a scheduler needs (:mod:`.local`, :mod:`.local_docker`, :mod:`.slurm`,
:mod:`.k8s`, each a class or function giving them public names, with the releases they hold
for), what differs between TorchX releases (:mod:`.releases`) and TorchX's other built-in
schedulers kept in its table (:mod:`.builtin_schedulers`). No module outside this folder uses a
``_``-prefixed TorchX name (tests/unit/test_torchx_workarounds.py)."""
