"""How weights travel from the learner to the engines: the format of a publish."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PublishedWeights:
    """A full state dict as the learner puts it into the object store, once per publish.

    numpy arrays, which Ray stores out of band and every worker maps zero-copy. numpy has no
    bfloat16, so a bf16 tensor travels as its 16-bit pattern (an int16 view of the same bytes)
    and `dtypes` names it: bf16 weights cross the object store at 2 bytes a parameter, with no
    float32 round trip.
    """

    arrays: dict
    """HF parameter name -> numpy array of the tensor's bytes (same shape)."""
    dtypes: dict
    """HF parameter name -> torch dtype name ('bfloat16'), for tensors numpy cannot represent."""

    @classmethod
    def from_state_dict(cls, state: dict) -> "PublishedWeights":
        import torch

        arrays, dtypes = {}, {}
        for name, tensor in state.items():
            tensor = tensor.detach().contiguous().cpu()
            if tensor.dtype == torch.bfloat16:
                arrays[name], dtypes[name] = tensor.view(torch.int16).numpy(), "bfloat16"
            else:
                arrays[name] = tensor.numpy()
        return cls(arrays, dtypes)


def weights_as_tensors(state) -> dict:
    """Published weights (`PublishedWeights`, or a state dict of numpy arrays or tensors) as tensors.

    The arrays are read-only views; loading copies them into the engine's parameters, which
    is the only thing done with them.
    """
    import warnings

    import numpy as np
    import torch

    dtypes = {}
    if isinstance(state, PublishedWeights):
        state, dtypes = state.arrays, state.dtypes
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensors = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in state.items()}
    return {k: v.view(getattr(torch, dtypes[k])) if k in dtypes else v for k, v in tensors.items()}
