"""ShardedOptimizer's whole state in and out: torch-format state dicts (consolidated on
one rank, loaded into every rank's shard) and sx's own checkpoints."""
import torch

from ._kinds import (_ADAFACTOR_EPS1, _ADJUST_LR_FN, _CONSTRUCTOR_ONLY, _FLAGS, _GROUP_STEP, _INSTANCE_KEY, _KEYS,
                     _STATE_DTYPE_OF, _SX_NAMES, _hyper)
from ._mixed_precision import _as_array

try:
    from torchao.optim.quant_utils import dequant_with_qmap as _dequant, quantize_8bit_with_qmap as _quantize
    from torchao.optim.subclass_8bit import OptimState8bit as _OptimState8bit
except ImportError:
    _OptimState8bit = None

# torchao's rule (and sx's): a param of fewer elements, or not a whole number of blocks,
# keeps fp32 state in an 8-bit group.
_MIN_8BIT_NUMEL, _BLOCK = 4096, 256
# Slots never negative, which torchao quantizes with its unsigned map.
_UNSIGNED_SLOTS = ("exp_avg_sq", "max_exp_avg_sq")


def _bits_equal(a, b):
    """Per row of two [blocks, 256] float32 tensors: every element the same bits (or both NaN)."""
    return ((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all(dim=1)


def _quantized(t, signed, dtype):
    """torchao's OptimState8bit holding the codes and scales that sx's decoding of them
    gave `t` (fp32, whole blocks). torchao's quantization (OptimState8bit.copy_) finds
    them where a block's extreme decodes to its scale times 1.0; where it decodes to the
    signed map's lowest entry (-0.99297, a block whose largest magnitude is negative), the
    scale is that value over the entry (give or take an ulp), and the codes torchao's
    quantizer gives under it (sx's scatter finds them so too)."""
    q = _OptimState8bit.zeros(t.shape, signed, _BLOCK, dtype=dtype)
    q.copy_(t)  # torchao's quantization: scale_tensor, quantize_8bit_with_qmap
    flat = t.reshape(-1, _BLOCK)
    codes = q.codes.view(-1, _BLOCK)
    undone = ~_bits_equal(_dequant(codes, q.qmap, q.scale), flat)
    if not undone.any():
        return q
    rows = undone.nonzero().reshape(-1)
    near = flat[rows].amin(dim=1) / q.qmap[0]
    for scale in (near, torch.nextafter(near, torch.zeros_like(near)), torch.nextafter(near, torch.ones_like(near))):
        trial = _quantize(flat[rows] / scale.view(-1, 1), q.qmap)
        found = _bits_equal(_dequant(trial, q.qmap, scale), flat[rows]) & (scale >= 0) & undone[rows]
        codes[rows[found]] = trial[found]
        q.scale[rows[found]] = scale[found]
        undone[rows[found]] = False
    return q


def _slot_tensor(values, name, p, state_dtype, as_torchao):
    """A slot's whole values (fp32, as sx's gather decodes them) in the form its peer keeps
    them: bf16 state as bf16 tensors (exact: the values are bf16's); torchao's 8-bit
    classes' quantized slots as torchao's OptimState8bit with sx's codes and scales
    (_quantized); fp32 tensors otherwise (a param too small for 8 bits, as torchao keeps
    it)."""
    t = torch.from_numpy(values).view(_state_shape(name, p.shape)).clone()
    if state_dtype == "bf16":
        return t.to(torch.bfloat16)
    if as_torchao and state_dtype == "8bit" and t.numel() >= _MIN_8BIT_NUMEL and t.numel() % _BLOCK == 0:
        return _quantized(t, name not in _UNSIGNED_SLOTS, p.dtype)
    return t


def _slot_array(t):
    """What a state dict's slot holds, as fp32 values to scatter: torchao's 8-bit state
    dequantized (each code's map entry times its block's scale, which sx's scatter
    quantizes back to the same codes and scales)."""
    if _OptimState8bit is not None and isinstance(t, _OptimState8bit):
        t = t.dequantize(torch.float32)
    return _as_array(t)


def _state_shape(name, shape):
    """The shape torch keeps a param's state tensor in: the param's, but Adafactor's
    factored moments of a param of two or more dimensions (torch.optim.Adafactor's
    row_var [..., R, 1] and col_var [..., 1, C])."""
    shape = tuple(shape)
    if name == "row_var":
        return shape[:-1] + (1,)
    if name == "col_var":
        return shape[:-2] + (1, shape[-1])
    return shape


class _StateDicts:
    """ShardedOptimizer's part that moves the optimizer state: torch's state dicts and sx
    checkpoints (the consolidated dict is _consolidated until the next step)."""

    # -- whole state, in torch's format ------------------------------------------------
    def consolidate_state_dict(self, to=0):
        """Collective: gathers the whole optimizer state onto rank ``to``, one param at a
        time, as ZeroRedundancyOptimizer.consolidate_state_dict; that rank's
        :meth:`state_dict` then returns it in torch's format."""
        states = self.group.gather_optim_state(root=to)
        self._consolidated = None if states is None else self._torch_state_dict(states)

    def state_dict(self):
        """The consolidated optimizer state in torch's format (a dict that
        ``torch.optim.<class>.load_state_dict`` accepts), on the rank it was consolidated
        to (with one rank, consolidated here if needed). Packed state as its peer keeps
        it: torchao's 8-bit classes' quantized slots as OptimState8bit with sx's codes and
        scales, bf16 state as bf16 tensors."""
        if self._consolidated is None and self.group.world_size == 1:
            self.consolidate_state_dict(to=0)
        if self._consolidated is None:
            raise RuntimeError("the optimizer state has not been consolidated on this rank since the last step: "
                               "call consolidate_state_dict(to=rank) on every rank first")
        return self._consolidated

    def _torch_state_dict(self, states):
        as_torchao = self.optimizer_class in _STATE_DTYPE_OF
        state = {}
        for i, st in enumerate(states):
            p = self._params[i]
            entry = {}
            if self._kind == "sgd":
                if "momentum_buffer" in st.tensors and st.momentum_steps > 0:
                    entry["momentum_buffer"] = torch.from_numpy(st.tensors["momentum_buffer"]).view(p.shape).clone()
            elif st.step > 0:
                # lion-pytorch and torch's Muon keep no step; pytorch-optimizer's Lamb and
                # AdEMAMix keep theirs in the param group
                if self._kind not in ("lion", "muon") + _GROUP_STEP:
                    entry["step"] = torch.tensor(float(st.step), dtype=torch.float32)
                for name, values in st.tensors.items():
                    if name != "master":
                        entry[name] = _slot_tensor(values, name, p, self._state_dtype, as_torchao)
                if self._kind == "nadam":
                    entry["mu_product"] = torch.tensor(st.mu_product, dtype=torch.float32)
            if self._param_dtype is not None and "master" in st.tensors:
                entry["master"] = torch.from_numpy(st.tensors["master"]).view(p.shape).clone()
            if entry:
                state[i] = entry
        groups, index = [], 0
        skip = ("params",) + _CONSTRUCTOR_ONLY.get(self._kind, ())
        for gi, group in enumerate(self.param_groups):
            g = {k: v for k, v in group.items() if k not in skip}
            if as_torchao and not isinstance(g.get("lr"), torch.Tensor):
                g["lr"] = torch.tensor(g["lr"], dtype=torch.float32)  # torchao's classes keep it so
            g["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(g)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Collective (every rank passes the same dict, as to ZeroRedundancyOptimizer):
        loads a torch-format optimizer state dict, e.g. one saved by
        ``torch.optim.AdamW``, into every rank's shard. Hyperparameters come from its
        param groups; the params' values stay (16-bit params keep theirs as masters).
        torchao's OptimState8bit slots are dequantized and stored again in sx's 8-bit
        state with the same codes and scales."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"the state dict has {len(groups)} param groups, this optimizer "
                             f"{len(self.param_groups)}")
        for mine, theirs in zip(self.param_groups, groups):
            if len(mine["params"]) != len(theirs["params"]):
                raise ValueError("a param group of the state dict has another number of params")
        # torch's indices in the dict's groups, in our order
        order = [i for g in groups for i in g["params"]]
        for mine, theirs in zip(self.param_groups, groups):
            if self._kind in _GROUP_STEP:
                mine.pop("step", None)  # the dict's, or none before the class's first step
            for key, value in theirs.items():
                if key != "params":
                    mine[key] = value
        # sx keeps the state tensors its hyperparameters need (a momentum buffer, the
        # running max of amsgrad): they take the dict's before its state is scattered.
        self._push_hyperparameters()
        saved = state_dict["state"]
        kind = self._kind
        group_steps, stateful = [], set()
        if kind in _GROUP_STEP:
            # The class counts steps per group: a param with state takes its group's count,
            # which sx's scatter gives the group (the most of its params'). A group none of
            # whose params has state yet gives every param its count (their state stays
            # zero, as the class would create it).
            group_steps = [int(g.get("step", 0)) for g in groups]
            stateful = {gi for gi, g in enumerate(groups) for i in g["params"] if saved.get(i)}

        def fill(st):
            entry = saved.get(order[st.index], {})
            p = self._params[st.index]
            for name in st.tensors:
                if name == "master":  # the dict's (param_dtype's state dicts hold them), or the current values
                    master = entry.get("master")
                    st.tensors[name][...] = _as_array(p.data if master is None else master)
                elif name in entry and entry[name] is not None:
                    values = _slot_array(entry[name])
                    if values.size != st.tensors[name].size:
                        raise ValueError(f"param {order[st.index]}: state '{name}' has {values.size} values; "
                                         f"torch keeps it in shape {list(_state_shape(name, p.shape))}")
                    st.tensors[name][...] = values
            if kind == "sgd":
                st.momentum_steps = 1 if entry.get("momentum_buffer") is not None else 0
                st.step = st.momentum_steps
            elif kind in _GROUP_STEP:
                st.step = group_steps[st.param_group] if entry or st.param_group not in stateful else 0
            else:
                step = entry.get("step", 0)
                st.step = int(step.item() if isinstance(step, torch.Tensor) else step)
                mu = entry.get("mu_product", 0.0)  # NAdam's; 0: sx derives it from the step
                st.mu_product = float(mu.item() if isinstance(mu, torch.Tensor) else mu)

        with self.full_params():  # stage 3: the masters' values are read from the params
            self.group.scatter_optim_state(fill if self.group.rank == 0 else None, root=0)
        self._consolidated = None

    # -- sx checkpoints -------------------------------------------------------------
    def save(self, path, user_blob=b"", **options):
        """Collective: an sx checkpoint of the params and the optimizer state (see
        ShardGroup.save; returns its Future)."""
        return self.group.save(path, user_blob, **options)

    def load(self, path, **options):
        """Collective: loads an sx checkpoint saved at any world size into the params and
        the state; the param groups' hyperparameters follow it (Lamb's and AdEMAMix's
        "step" too: the group's step count the checkpoint holds)."""
        self.group.load(path, **options)
        for gi, group in enumerate(self.param_groups):
            def get(key, gi=gi):
                return self.group.get_hyperparameter(gi, _SX_NAMES.get(key, key))
            if self._kind in _GROUP_STEP and not options.get("params_only"):
                steps = self.group.param_group_steps(gi)
                if steps > 0:
                    group["step"] = steps
                else:  # as the class's group before its first step
                    group.pop("step", None)
            for key in ("lr", "weight_decay", "maximize") + _KEYS[self._kind]:
                if key not in group:
                    continue
                if key == "betas" and self._kind == "ademamix":
                    group["betas"] = (get("beta1"), get("beta2"), get("beta3"))
                elif key == "betas":
                    group["betas"] = (get("beta1"), get("beta2"))
                elif key == "t_alpha_beta3":  # sx's 0: no warmup, the class's None
                    group[key] = get(key) or None
                elif key == "ns_coefficients":
                    group[key] = (get("ns_a"), get("ns_b"), get("ns_c"))
                elif key == "ns_steps":
                    group[key] = int(get(key))
                elif key == "adjust_lr_fn":  # the group's own name while it means the same
                    value = int(get("adjust_lr"))
                    if _ADJUST_LR_FN.get(group[key]) != value:
                        group[key] = next(n for n, v in _ADJUST_LR_FN.items() if n is not None and v == value)
                elif key == "eps" and self._kind == "adafactor":  # torch's (eps1, eps2); None while it means the same
                    eps1 = get("eps")
                    group[key] = (None if group[key][0] is None and eps1 == _ADAFACTOR_EPS1 else eps1, get("eps2"))
                else:
                    value = get(key)
                    group[key] = bool(value) if key in _FLAGS else value
            self._pushed[gi] = _hyper(self._kind, group)
            if self._instance is not None:  # the checkpoint holds the saving optimizer's number
                self.group.set_hyperparameter(gi, _INSTANCE_KEY, float(self._instance))
