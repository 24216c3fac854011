"""Stand-ins for framework arrays in CPU tests (no torch needed)."""

from __future__ import annotations

from types import SimpleNamespace


class TorchTensorStub:
    """Enough of a torch.Tensor for cunorm to classify it and look up its layout: a float32
    vector of 3 elements on the CPU or on CUDA device 0, never exchanged through DLPack."""

    __module__ = "torch"
    shape = (3,)
    dtype = "torch.float32"
    requires_grad = False

    def __init__(self, is_cuda: bool) -> None:
        self.is_cuda = is_cuda

    def stride(self) -> tuple[int, ...]:
        return (1,)

    def get_device(self) -> int:
        return 0 if self.is_cuda else -1

    def __dlpack__(self, stream=None):  # pragma: no cover - never reached
        raise AssertionError("must be refused before any DLPack exchange")


class CupyDevices:
    """Enough of ``cupy.cuda`` for cunorm's device switch, as :attr:`module`: ``Device(n)``, a
    context manager that makes ``n`` current (recording it in :attr:`switches`) and restores
    the previous device on exit, and ``runtime.getDevice``. Device 0 starts current."""

    def __init__(self) -> None:
        self.current = 0
        self.switches: list[int] = []
        devices = self

        class Device:
            def __init__(self, dev: int) -> None:
                self.dev = dev

            def __enter__(self):
                devices.switches.append(self.dev)
                self.prev, devices.current = devices.current, self.dev

            def __exit__(self, *exc):
                devices.current = self.prev

        self.module = SimpleNamespace(cuda=SimpleNamespace(
            Device=Device, runtime=SimpleNamespace(getDevice=lambda: devices.current)))
