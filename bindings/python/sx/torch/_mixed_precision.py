"""Mixed precision (param_dtype, grad_dtype, reduce_dtype): the torch dtypes sx.torch
takes, fp32 params computing in bf16 or fp16 with fp32 master weights in sx, and the
module's inputs cast to the params' dtype."""
import numpy as np
import torch

from .. import _lib
from ..errors import InvalidArgumentError

# The torch dtypes sx.torch takes, by sx's names for them.
_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def _dtype_choice(what, value):
    """grad_dtype's or reduce_dtype's name for ShardGroup, given as a torch dtype or a name."""
    if value is None or isinstance(value, str):
        return value
    if value not in _DTYPES:
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT, f"{what} {value}: one of "
                                   f"{sorted(str(d) for d in _DTYPES)}")
    return _DTYPES[value]


def _cast_inputs(dtype, _module, args, kwargs):
    """param_dtype: the root module's floating-point tensor inputs in the params' dtype,
    as FSDP's MixedPrecisionPolicy(cast_forward_inputs=True) casts them."""
    def cast(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
            return x.to(dtype)
        if isinstance(x, (list, tuple)):
            return type(x)(cast(v) for v in x)
        if isinstance(x, dict):
            return {k: cast(v) for k, v in x.items()}
        return x
    return cast(args), cast(kwargs)


def _as_array(t):
    """A contiguous float32 numpy array of a tensor (or number) of any float dtype."""
    if isinstance(t, torch.Tensor):
        return t.detach().to(torch.float32).reshape(-1).cpu().numpy()
    return np.asarray(t, dtype=np.float32).reshape(-1)


class _MixedPrecision:
    """ShardedOptimizer's part for param_dtype: the dtype each param computes in, and the
    fp32 values of converted params seeding their masters (the constructor sets
    _param_dtype and _masters)."""

    def _compute_dtype(self, p):
        """The dtype param p has in sx and in the model: param_dtype's for an fp32 one."""
        return self._param_dtype if self._param_dtype is not None and p.dtype == torch.float32 else p.dtype

    def _seed_masters(self, from_rank0):
        """param_dtype: the converted params' fp32 values become their masters (exactly:
        the step updates them, and the 16-bit params are their rounding). `from_rank0`: a
        collective; every rank takes rank 0's values (construction with
        sync_module_states). Else each rank writes its own into its shard in place."""
        if not self._masters:
            return
        masters, self._masters = self._masters, {}
        if from_rank0:
            def fill(st):
                if st.index in masters:
                    st.tensors["master"][...] = _as_array(masters[st.index])
            self.group.scatter_optim_state(fill if self.group.rank == 0 else None, root=0)
            return
        for i, values in masters.items():
            info = self.group.param_info(i)
            if info.shard_end > info.shard_begin:
                view = self.group.state_view(i, "master")
                view[...] = _as_array(values)[info.shard_begin:info.shard_end]
