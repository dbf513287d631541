"""Where the learner's tensors live: the device named by `learner.device`, and the host copies
that leave it (checkpoints, exports).

`auto` is resolved once, here, and said in the log; `cuda` on a machine without a GPU never
gets this far (rlpipe.config_checks.learner_device stops it as a config error). Everything the
learner keeps on its device is made there or moved there explicitly; what is written to disk
is moved back to host memory first, so a checkpoint taken on a GPU loads on a CPU-only
machine with a plain `torch.load` and the other way round.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def pick_device(name: str) -> torch.device:
    """The torch device for `learner.device` (cpu, cuda or auto)."""
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        log.info("learner.device=auto: picked cuda (%s)", torch.cuda.get_device_name(0))
        return torch.device("cuda")
    build = f"no CUDA device visible to torch {torch.__version__}" if torch.version.cuda else "a CPU-only torch"
    log.info("learner.device=auto: picked cpu (%s)", build)
    return torch.device("cpu")


def to_host(obj):
    """`obj` (nested dicts, lists and tuples of tensors and plain values) with every tensor
    in host memory: what torch.save writes, whatever device the learner trains on."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(v) for v in obj)
    return obj
