"""Stand-ins for framework arrays in CPU tests (no torch needed)."""

from __future__ import annotations


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
