"""ShardedOptimizer's params: param groups added (at construction and after), laid out
in sx's units, and bound to sx's memory (.data and .grad views of sx's buffers)."""
import collections

import torch

from .. import _lib
from ..errors import InvalidArgumentError, UnsupportedError
from ..group import _DTYPES as _SX_DTYPES
from ._kinds import _FIXED, _IGNORED, _INSTANCE_KEY, _STATE_DTYPE_OF, _check_torchao, _hyper
from ._mixed_precision import _DTYPES


class Split(collections.namedtuple("Split", "global_shape dim offset")):
    """sx.torch's `placements` value for a piece of a larger logical tensor: the param is
    [offset, offset + shape[dim]) on dimension `dim` of a tensor of `global_shape` (a
    Megatron column-parallel weight: dim 0; a row-parallel one: dim 1)."""


class Replicated(collections.namedtuple("Replicated", "index count")):
    """sx.torch's `placements` value for copy `index` of `count` identical copies (a
    layer norm or a bias on every tensor-parallel rank): in a norm domain copy 0 alone
    counts in the gradient norm."""


def _placement_table(placements, params):
    """The constructor's `placements` as {name or id(tensor): Split or Replicated},
    checked: each value of those types, each key a name (str) or a tensor."""
    table = {}
    for key, where in dict(placements or {}).items():
        if not isinstance(where, (Split, Replicated)):
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                       f"placements[{key!r}] is a {type(where).__name__}; it is sx.torch.Split"
                                       "(global_shape, dim, offset) or sx.torch.Replicated(index, count)")
        if isinstance(key, torch.Tensor):
            table[id(key)] = where
        elif isinstance(key, str):
            table[key] = where
        else:
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                       f"placements has a key of type {type(key).__name__}: it names a param "
                                       "(str) or is the param itself")
    return table


def _wrap_units(module, policy):
    """FSDP's auto-wrap as units: every module for which policy(module) is true, innermost
    first, makes a unit of its params that no module inside it took; the params left make
    the root's unit. Units are numbered 0.. in the order of their first param in
    module.parameters(). Returns id(param) -> unit, and unit -> the module that owns it."""
    owner = {}
    owners = []  # per group, its module
    for m in reversed(list(module.modules())):  # every module after the ones inside it
        if m is module or not policy(m):
            continue
        mine = [p for p in m.parameters() if id(p) not in owner]
        for p in mine:
            owner[id(p)] = len(owners)
        if mine:
            owners.append(m)
    rest = [p for p in module.parameters() if id(p) not in owner]
    for p in rest:
        owner[id(p)] = len(owners)
    if rest:
        owners.append(module)
    order = {}
    for p in module.parameters():
        order.setdefault(owner[id(p)], len(order))
    return {pid: order[g] for pid, g in owner.items()}, {order[g]: m for g, m in enumerate(owners)}


class _Params:
    """ShardedOptimizer's part that adds params to sx and binds them to its memory (its
    state is set by the constructor: _params, _names, _grads, _units, the unit being
    filled, ...). Stage 3's binding is _Hooks._bind_sharded."""

    def add_param_group(self, param_group):
        """Adds a param group, as torch's; after construction it is a collective (every
        rank adds the same group), and the new params join sx's buffers while the others
        keep theirs, their state and their step counts."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, not {type(param_group).__name__}")
        if self._finalized and self._stage == 3:
            raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED, "add_param_group after construction at stage 3: the "
                                   "new params' modules would need hooks; pass every param group at first")
        params = param_group["params"]
        params = [params] if isinstance(params, (torch.Tensor, tuple)) else list(params)
        names = []
        plain = []
        for p in params:
            if isinstance(p, tuple):
                names.append(str(p[0]))
                plain.append(p[1])
            else:
                names.append(None)
                plain.append(p)
        group = dict(param_group)
        group["params"] = plain
        first = len(self._params)
        # What sx would refuse, refused before anything changes.
        for k, p in enumerate(plain):
            what = names[k] if names[k] is not None else f"param.{first + k}"
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"{what} is a {type(p).__name__}, not a tensor")
            if p.device.type != "cpu" or p.dtype not in _DTYPES:
                raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                                       f"{what} has dtype {p.dtype} on {p.device}: sx.torch takes CPU tensors of "
                                       f"dtype {sorted(str(d) for d in _DTYPES)}")
            if p.numel() == 0:
                raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                                       f"{what} has shape {tuple(p.shape)}: sx holds no param without elements "
                                       "(leave it out of the optimizer)")
            if self._grad_dtype is not None and (_SX_DTYPES[_DTYPES[self._compute_dtype(p)]]
                                                 != _SX_DTYPES.get(self._grad_dtype)):
                raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                                       f"grad_dtype {self._grad_dtype} for {what}, which computes in "
                                       f"{self._compute_dtype(p)}: torch's autograd keeps a .grad in its param's "
                                       "dtype (reduce_dtype=torch.float32 reduces 16-bit gradients in fp32)")
        for key in group:
            if (key not in _IGNORED and key != "params" and key not in self.defaults
                    and key not in _FIXED.get(self._kind, ())):  # those _hyper refuses naming them
                raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT, f"unknown param group key {key!r}")
        super().add_param_group(group)  # torch's checks and defaults
        try:
            self._add_to_sx(self.param_groups[-1], names, first)
        except BaseException:
            if len(self._pushed) < len(self.param_groups):
                self.param_groups.pop()  # sx did not take the group: torch's view of it goes too
            for i in [i for i in self._masters if i >= first]:  # param_dtype's conversions undone
                plain[i - first].data = self._masters.pop(i)
            raise
        self._consolidated = None

    def _add_to_sx(self, group, names, first):
        extra = {} if self._instance is None else {_INSTANCE_KEY: float(self._instance)}
        if self.optimizer_class in _STATE_DTYPE_OF:
            _check_torchao(group)
        if self._state_dtype != "fp32":
            extra["state_dtype"] = self._state_dtype
        if self.optimizer_class in _STATE_DTYPE_OF and group.get("bf16_stochastic_round"):
            if self._param_dtype is not None:
                raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                                       "bf16_stochastic_round=True keeps bf16 params without fp32 masters; "
                                       "give sx.torch a bf16 model rather than param_dtype, whose fp32 values "
                                       "would seed masters")
            extra["bf16_stochastic_round"] = True
        index = self.group.add_param_group(self._kind, **_hyper(self._kind, group), **extra)
        self._pushed.append(_hyper(self._kind, group))
        if self._finalized:
            # The units laid out already are closed: the new params start a unit of their own.
            self._unit, self._unit_bytes = self._unit + 1, 0
        for k, p in enumerate(group["params"]):
            name = names[k] if names[k] is not None else f"param.{first + k}"
            nbytes = p.numel() * p.element_size()
            if self._wrapped is not None and not self._finalized:
                unit = self._wrapped[id(p)]  # the policy's units, numbered 0.. in param order
                self._unit = max(self._unit, unit)
            else:
                if self._unit_bytes + nbytes > self._bucket_bytes and self._unit_bytes > 0:
                    self._unit, self._unit_bytes = self._unit + 1, 0
                self._unit_bytes += nbytes
                unit = self._unit
            if self._compute_dtype(p) != p.dtype:  # param_dtype: the fp32 values seed the masters
                self._masters[first + k] = p.data
                p.data = p.data.to(self._param_dtype)
            self.group.add_param(name, tuple(p.shape), param_group=index, unit=unit,
                                 dtype=_DTYPES[p.dtype], frozen=not p.requires_grad, **self._placement_of(name, p))
            self._params.append(p)
            self._names.append(name)
            self._units.append(unit)  # unit ids are 0..n-1: a unit's index is its id
        if self._finalized:
            self.group.finalize()
            self._bind(first)
            self._seed_masters(False)

    def _placement_of(self, name, p):
        """add_param's placement keywords for param `p` called `name`, from the
        constructor's `placements` (by name, or by the tensor itself); each key used is
        marked, so that one naming no param is refused."""
        key = name if name in self._placements else id(p) if id(p) in self._placements else None
        if key is None:
            return {}
        self._placed.add(key)
        where = self._placements[key]
        if isinstance(where, Split):
            return {"split": (tuple(where.global_shape), where.dim, where.offset)}
        return {"replica": (where.index, where.count)}

    def _bind(self, first, sync=False):
        """Params `first`.. take sx's memory: their values are copied in, then .data and
        .grad become views of sx's buffers. Stage 3: their units are gathered for it (and
        broadcast from rank 0 where `sync`), then released: .data is empty until a
        module's hooks gather its units again."""
        if self._stage == 3:
            self._bind_sharded(first, sync)
        else:
            self._bind_views(first)
        self._hook_new()
        self._expect()

    def _bind_views(self, first):
        for i in range(first, len(self._params)):
            p = self._params[i]
            with torch.no_grad():
                values = self._tensor(self.group.param_view(i), p)
                values.copy_(p.data)
                p.data = values
                grad = self._tensor(self.group.grad_view(i), p)
                grad.zero_()
            p.grad = grad
            self._grads.append(grad)
            self._touched.append(not self._skip_unreached)
            self._unhooked.add(i)

    @staticmethod
    def _tensor(array, like):
        t = torch.from_numpy(array)  # shares the memory, and keeps the array (and sx's) alive
        if like.dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)  # numpy has no bf16: the view holds its raw bits
        return t.view(like.shape)
