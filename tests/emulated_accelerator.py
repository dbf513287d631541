"""An accelerator for a CPU-only machine: tensors that live on a device of their own (`emu`),
computed on the CPU, and every op that mixes them with host tensors refused as CUDA refuses it.

Every machine that runs the suite is CPU-only, so a learner that mixes devices (PopArt's
statistics computed on the host while its buffers live on the GPU, a loss sum made without a
device) passes every test here and crashes at its first update on a GPU. Under `emulated()`,
code that puts its tensors on `DEVICE` meets the rules of a real second device:

- an op whose tensor operands are on `emu` and on the host fails with CUDA's message, except
  where CUDA allows it: a 0-dim host tensor (a scalar), the copies between devices
  (`.to`, `copy_`) and indexing with host indices;
- `.numpy()` of a device tensor fails (CUDA's "use Tensor.cpu()"); `.tolist()` and `.item()`
  read through, as they do on CUDA (a synchronizing copy);
- a generator belongs to a device: `torch.Generator(device=DEVICE)` makes one for `emu`, and
  sampling with a generator of the other device fails, as on CUDA;
- `torch.save` of a device tensor fails (its storage is not the host's): what is written
  must be moved to the host first, which is also what makes a GPU checkpoint load anywhere.

How: PyTorch's PrivateUse1 slot is registered as a Python backend named `emu`; an `EmuTensor`
is a wrapper subclass on that device around a CPU tensor, and a TorchDispatchMode runs every
op on the wrapped CPU tensors after checking the devices. Autograd, nn.Module.to and
optimizers work unchanged above it. The registration is process-wide and permanent (torch
then reports an accelerator), so the checks that use it run in a child interpreter of their
own (tests/test_device.py runs tests/device_checks.py).
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten

# Ops that CUDA runs with operands on both sides: the copies, and indexing with host indices.
_CROSS_DEVICE = {
    aten.copy_.default,
    aten._to_copy.default,
    aten.index.Tensor,
    aten.index_put_.default,
    aten.index_put.default,
    aten._index_put_impl_.default,
}

# Registered on import, once per process (it cannot be undone): import this module only in
# a process of its own.
if torch._C._get_privateuse1_backend_name() != "emu":
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(rename="emu")
DEVICE = torch.device("emu", 0)


class EmuTensor(torch.Tensor):
    """A tensor on `emu`, holding its values in a CPU tensor (`inner`)."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            inner.shape,
            dtype=inner.dtype,
            device=DEVICE,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            requires_grad=inner.requires_grad,
        )
        out.inner = inner
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # an op on emu tensors in a thread the mode does not cover (autograd's device thread)
        return _run(func, args, kwargs)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:
            return args[0].inner.tolist()
        if func is torch.Tensor.numpy:
            raise TypeError(
                "can't convert emu:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."
            )
        if func is torch.Tensor.__reduce_ex__:
            raise RuntimeError("torch.save of an emu tensor: move what is saved to the host first (.cpu())")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    def __repr__(self):
        return f"EmuTensor({self.inner!r})"


class EmuGenerator(torch._C.Generator):
    """A random stream of the `emu` device (a CPU generator underneath)."""

    @property
    def device(self) -> torch.device:
        return DEVICE


class _DeviceAwareGenerator(torch._C.Generator):
    """What `torch.Generator` is under `emulated()`: an EmuGenerator for `emu`, the usual one
    otherwise."""

    def __new__(cls, device="cpu"):
        if torch.device(device).type == "emu":
            return EmuGenerator("cpu")
        return torch._C.Generator(device)


def _on_emu(x) -> bool:
    return isinstance(x, EmuTensor)


def _unwrap(x):
    return x.inner if isinstance(x, EmuTensor) else x


class _EmuMode(TorchDispatchMode):
    """Every op of the thread that entered `emulated()`: factories with device=emu included,
    which have no emu operand for EmuTensor's own dispatch to see."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs)


def _run(func, args, kwargs):
    """`func` on the CPU tensors inside, after CUDA's device checks; results on emu where the
    op's result is on the device."""
    kwargs = dict(kwargs or {})
    tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
    on_emu = any(_on_emu(x) for x in tensors)
    host = [tuple(x.shape) for x in tensors if not _on_emu(x) and x.dim() > 0]
    if on_emu and host and func not in _CROSS_DEVICE:
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"emu:0 and cpu! ({func}: host operands of shapes {host})"
        )
    target = kwargs.get("device")
    if target is not None:  # a factory or a copy to a named device
        out_emu = torch.device(target).type == "emu"
        kwargs["device"] = torch.device("cpu")
    elif func is aten._to_copy.default:
        out_emu = _on_emu(args[0])
    else:
        out_emu = on_emu
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    returns = func._schema.returns
    if returns and returns[0].alias_info is not None and returns[0].alias_info.is_write:
        return kwargs.get("out", args[0])  # in place or out=: the caller's own tensor, updated
    if not out_emu:
        return out
    return tree_map(lambda x: EmuTensor(x) if isinstance(x, torch.Tensor) else x, out)


_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}


class _FunctionLevel(TorchFunctionMode):
    """What is seen above dispatch: a generator of the other device is refused, as CUDA
    refuses it (below, the dispatcher hands over a new generator object, which no longer says
    which device it was made for); tensors made from Python data on emu are made on the host
    and copied (torch.tensor's own copy skips the Python dispatch that emu needs)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FROM_DATA and kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "emu":
            return func(*args, **{**kwargs, "device": "cpu"}).to(DEVICE)
        gen = kwargs.get("generator")
        if isinstance(gen, torch._C.Generator):
            if "device" in kwargs:
                out_emu = kwargs["device"] is not None and torch.device(kwargs["device"]).type == "emu"
            else:
                out_emu = any(_on_emu(x) for x in tree_flatten((args, kwargs))[0])
            if isinstance(gen, EmuGenerator) != out_emu:
                want, have = ("emu", "cpu") if out_emu else ("cpu", "emu")
                raise RuntimeError(f"Expected a '{want}' device type for generator but found '{have}' ({func})")
        return func(*args, **kwargs)


@contextlib.contextmanager
def emulated():
    """Within: `DEVICE` is a device of its own, with the rules above."""
    saved = torch.Generator
    torch.Generator = _DeviceAwareGenerator
    try:
        with _FunctionLevel(), _EmuMode():
            yield DEVICE
    finally:
        torch.Generator = saved
