"""cunorm: fast softmax, log_softmax, layer_norm, rms_norm and attention on NVIDIA GPUs.

CuPy arrays run hand-written CUDA kernels (``cuda_src/``); NumPy arrays run a NumPy reference
path; PyTorch and JAX GPU arrays are computed zero-copy through DLPack. Importing cunorm never
touches the GPU or compiles anything.
"""

from ._config import show_config
from .attention import attention
from .norm import layer_norm, rms_norm
from .norm_grad import layer_norm_backward, rms_norm_backward
from .softmax import log_softmax, softmax
from .softmax_grad import log_softmax_backward, softmax_backward

__version__ = "0.1.0"

__all__ = ["softmax", "log_softmax", "softmax_backward", "log_softmax_backward", "layer_norm",
           "rms_norm", "layer_norm_backward", "rms_norm_backward", "attention", "show_config",
           "__version__"]
