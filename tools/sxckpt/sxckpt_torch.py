"""Moving training state between PyTorch and sx, through the files that
`sxckpt export` writes and `sxckpt import` reads (docs/format.md, "The sxckpt tool").

Needs torch and Python's standard library only (the safetensors files are read and
written here, without the `safetensors` package).

From sx to torch:

    sxckpt export --safetensors model.safetensors --optimizer optim CKPT

    model.load_state_dict(sxckpt_torch.load_weights("model.safetensors"), strict=True)
    doc, state = sxckpt_torch.read_optimizer("optim")
    opt = torch.optim.AdamW(sxckpt_torch.param_groups(doc, model, "AdamW"))
    opt.load_state_dict(sxckpt_torch.optimizer_state_dict(doc, state, "AdamW"))

From torch to sx:

    sxckpt_torch.write(model, [opt], "model.safetensors", "optim")

    sxckpt import --safetensors model.safetensors --optimizer optim --world-size 8 CKPT

A checkpoint whose param groups use several optimizers (AdamW and SGD) becomes one
torch optimizer per kind: pass the kind ("AdamW", "SGD", "RMSprop", ...) to param_groups and
optimizer_state_dict; a torch index counts the params of that kind's groups only.

8-bit optimizer state (torchao 0.18's AdamW8bit and Adam8bit), both ways:

    sxckpt export --safetensors model.safetensors --optimizer optim --state-format torchao CKPT

    doc, state = sxckpt_torch.read_optimizer("optim")
    opt = torchao.optim.AdamW8bit(sxckpt_torch.torchao_param_groups(doc, model, "AdamW"))
    opt.load_state_dict(sxckpt_torch.torchao_state_dict(doc, state, "AdamW"))

    sxckpt_torch.write(model, [opt], "model.safetensors", "optim")  # an AdamW8bit too
"""
import ctypes
import json
import os
import struct

import torch

__all__ = ["read_safetensors", "write_safetensors", "load_weights", "read_optimizer",
           "param_groups", "optimizer_state_dict", "torchao_param_groups", "torchao_state_dict", "write"]

SCHEMA_VERSION = 1

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "U8": torch.uint8}
# torchao's 8-bit optimizers: the torch class whose maths each follows. sx keeps their state
# in 8 bits ("state_dtype": "8bit") in blocks of 256 elements, torchao's default.
_TORCHAO_8BIT = {"AdamW8bit": "AdamW", "Adam8bit": "Adam"}
_TORCHAO_BLOCK = 256
# The 8-bit form of a slot in PREFIX.safetensors: NAME.SLOT.codes (U8) and NAME.SLOT.scale.
_CODES, _SCALE = ".codes", ".scale"
_STATE_KEYS = {  # torch's per-param state tensors, as the tensors' name suffixes
    "AdamW": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
    "Adam": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
    "SGD": ("momentum_buffer",),
    "Adagrad": ("sum",),
    "RMSprop": ("square_avg", "momentum_buffer", "grad_avg"),
    "Adamax": ("exp_avg", "exp_inf"),
    "NAdam": ("exp_avg", "exp_avg_sq"),
    "RAdam": ("exp_avg", "exp_avg_sq"),
    "Lion": ("exp_avg",),
    "Lamb": ("exp_avg", "exp_avg_sq"),
    "Muon": ("momentum_buffer",),
    # A 0-D or 1-D param's variance; a larger one's factored moments, in torch's shapes
    # [..., R, 1] and [..., 1, C].
    "Adafactor": ("variance", "row_var", "col_var"),
    "AdEMAMix": ("exp_avg", "exp_avg_sq", "exp_avg_slow"),
}
_HYPER_KEYS = {  # the param group keys PREFIX.json holds (torch's names)
    "AdamW": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
    "Adam": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
    "SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"),
    "Adagrad": ("lr", "lr_decay", "eps", "weight_decay", "initial_accumulator_value", "maximize"),
    "RMSprop": ("lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize"),
    "Adamax": ("lr", "betas", "eps", "weight_decay", "maximize"),
    "NAdam": ("lr", "betas", "eps", "weight_decay", "momentum_decay", "decoupled_weight_decay", "maximize"),
    "RAdam": ("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "maximize"),
    "Lion": ("lr", "betas", "weight_decay", "maximize"),
    "Lamb": ("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "maximize"),
    "Muon": ("lr", "weight_decay", "momentum", "nesterov", "eps", "ns_a", "ns_b", "ns_c", "ns_steps", "adjust_lr"),
    "Adafactor": ("lr", "beta2_decay", "eps", "eps2", "d", "weight_decay", "maximize"),
    "AdEMAMix": ("lr", "betas", "beta3", "eps", "weight_decay", "alpha", "t_alpha_beta3", "decoupled_weight_decay",
                 "maximize"),
}
# Adafactor's eps in torch: (eps1, eps2), eps1 None for the param dtype's machine epsilon
# (sx's is fp32's: its masters are fp32).
_ADAFACTOR_EPS1 = 2.0 ** -23
# Muon's keys in torch: ns_coefficients = (ns_a, ns_b, ns_c), ns_steps an int, adjust_lr_fn
# a name (None for sx's ORIGINAL).
_ADJUST_LR_FN = {0: None, 1: "match_rms_adamw", 2: "spectral_unclamped"}
# Keys a class names otherwise in its param groups (pytorch-optimizer's Lamb and AdEMAMix).
_TORCH_NAMES = {"Lamb": {"decoupled_weight_decay": "weight_decouple"},
                "AdEMAMix": {"decoupled_weight_decay": "weight_decouple"}}
# Keys a class takes in its constructor only, not per group: kept in PREFIX.json from the
# optimizer's attribute, left out of the torch param group (Lamb's maximize).
_CONSTRUCTOR_ONLY = {"Lamb": ("maximize",), "AdEMAMix": ("maximize",)}
# Classes that count steps per param group, not per param (pytorch-optimizer's Lamb and
# AdEMAMix: the group's `step` is their bias corrections' t; PREFIX.json keeps it as the
# group's "step").
_GROUP_STEP = {"Lamb", "AdEMAMix"}
# Options of a class that sx follows at one value (sx's LAMB is Lamb with these): a
# state dict's groups carry them (Lamb reads them from its groups), and a group that sets
# another value is refused.
_FIXED = {"Lamb": {"grad_averaging": True, "fixed_decay": False, "rectify": False, "adam": False,
                   "adam_debias": False, "adanorm": False, "max_grad_norm": 1.0, "foreach": None},
          # fixed_decay (p *= 1 - wd, not 1 - lr * wd) would be a weight decay that changes
          # with the lr; cautious and stable_adamw change the update.
          "AdEMAMix": {"fixed_decay": False, "cautious": False, "stable_adamw": False, "foreach": None}}
# Keys a class's constructor does not take (lion-pytorch's Lion has no maximize): kept in
# PREFIX.json at this value, left out of the torch param group.
_NOT_IN_TORCH = {"Lion": {"maximize": False}}
# Classes whose per-param state has no `step` (lion-pytorch's Lion, pytorch-optimizer's
# Lamb and AdEMAMix, torch's Muon).
_NO_STEP = {"Lion", "Lamb", "Muon", "AdEMAMix"}


def read_safetensors(path):
    """(metadata, {name: tensor}) of a safetensors file, the tensors in the order of
    their data, each a new CPU tensor of its dtype (F32, F16, BF16 or U8)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, too few for a safetensors file")
    (n,) = struct.unpack_from("<Q", data, 0)
    if 8 + n > len(data):
        raise ValueError(f"{path}: the header length {n} runs past the end of the file (truncated?)")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    start, tensors = 8 + n, []
    for name, info in header.items():
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}; F32, F16, BF16 or U8 expected")
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= len(data) - start:
            raise ValueError(f"{path}: tensor {name!r} lies outside the file (truncated?)")
        tensors.append((begin, end, name, dtype, info["shape"]))
    out = {}
    for begin, end, name, dtype, shape in sorted(tensors):
        raw = bytearray(data[start + begin:start + end])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(shape)
    return metadata, out


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} as a safetensors file of F32 tensors (sx keeps fp32 values
    and state) and U8 ones (8-bit state's codes, uint8 tensors), in the given order, with
    `metadata` ({str: str}). The file appears whole: it is written as PATH.tmp, fsynced
    and renamed."""
    header, blobs, offset = {"__metadata__": dict(metadata or {})}, [], 0
    for name, t in tensors.items():
        dtype, size, st = (torch.uint8, 1, "U8") if t.dtype == torch.uint8 else (torch.float32, 4, "F32")
        t = t.detach().to(device="cpu", dtype=dtype).contiguous()
        blob = ctypes.string_at(t.data_ptr(), t.numel() * size)  # little-endian, as sx is
        header[name] = {"dtype": st, "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for blob in blobs:
                f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_weights(path):
    """The params of a file `sxckpt export --safetensors` wrote, as a state dict for
    torch.nn.Module.load_state_dict (fp32 tensors)."""
    return read_safetensors(path)[1]


def read_optimizer(prefix):
    """(doc, tensors): PREFIX.json as a dict, and the state tensors of PREFIX.safetensors."""
    with open(prefix + ".json", encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("schema_version", 0) > SCHEMA_VERSION:
        raise ValueError(f"{prefix}.json: schema_version {doc['schema_version']} is newer than this "
                         f"script's {SCHEMA_VERSION}")
    return doc, read_safetensors(prefix + ".safetensors")[1]


def _named(params):
    if isinstance(params, torch.nn.Module):
        return dict(params.named_parameters())
    return dict(params)


def _groups_of(doc, optimizer):
    kinds = sorted({g["optimizer"] for g in doc["param_groups"]})
    if optimizer is None:
        if len(kinds) > 1:
            raise ValueError(f"the param groups use {kinds}: name the optimizer whose groups you want")
        optimizer = kinds[0] if kinds else None
    return [g for g in doc["param_groups"] if g["optimizer"] == optimizer]


def _hyper(group):
    kind = group["optimizer"]
    skip = set(_NOT_IN_TORCH.get(kind, {})) | set(_CONSTRUCTOR_ONLY.get(kind, ()))
    names = _TORCH_NAMES.get(kind, {})
    out = {names.get(key, key): group[key] for key in _HYPER_KEYS[kind] if key not in skip}
    if "betas" in out:
        out["betas"] = tuple(out["betas"])
    if kind == "Muon":
        out["ns_coefficients"] = (out.pop("ns_a"), out.pop("ns_b"), out.pop("ns_c"))
        out["ns_steps"] = int(out["ns_steps"])
        out["adjust_lr_fn"] = _ADJUST_LR_FN[int(out.pop("adjust_lr"))]
    if kind == "Adafactor":
        out["eps"] = (out["eps"], out.pop("eps2"))
    if kind == "AdEMAMix":  # betas (beta1, beta2, beta3); no warmup is t_alpha_beta3 None
        out["betas"] = out["betas"] + (out.pop("beta3"),)
        out["t_alpha_beta3"] = out["t_alpha_beta3"] or None
    return out


def param_groups(doc, params, optimizer=None):
    """The param groups of `optimizer` ("AdamW", "Adam", "SGD"; may be omitted when the
    checkpoint uses one) as a torch optimizer's constructor takes them: each group's
    params, looked up by name in `params` (a Module or {name: param}), and its
    hyperparameters."""
    named = _named(params)
    return [{"params": _params_of(g, named), **_hyper(g)} for g in _groups_of(doc, optimizer)]


def _params_of(group, named):
    missing = [n for n in group["params"] if n not in named]
    if missing:
        raise KeyError(f"the checkpoint's params {missing} are not among the given params")
    return [named[n] for n in group["params"]]


def optimizer_state_dict(doc, tensors, optimizer=None):
    """A state dict of the torch optimizer made from param_groups(doc, ..., optimizer):
    state and params by integer index, in the order of the groups' params. A param gets
    state where the checkpoint has it: its state tensors and `step` (NAdam its mu_product
    too; Lion no step, as lion-pytorch keeps none); SGD its momentum buffer once an
    update has used it (momentum_steps > 0)."""
    state, groups, index = {}, [], 0
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    for g in _groups_of(doc, optimizer):
        kind, indices = g["optimizer"], []
        for name in g["params"]:
            entry = doc["state"][name]
            found = {k: tensors[f"{name}.{k}"] for k in _STATE_KEYS[kind] if f"{name}.{k}" in tensors}
            if kind == "SGD":
                if found and entry.get("momentum_steps", 0) > 0:
                    state[index] = {"momentum_buffer": found["momentum_buffer"].clone()}
            elif kind in _NO_STEP:
                if found:
                    state[index] = {k: t.clone() for k, t in found.items()}
            elif found:
                state[index] = {"step": torch.tensor(float(entry["step"]), dtype=scalar),
                                **{k: t.clone() for k, t in found.items()}}
                if "mu_product" in entry:  # NAdam's, a float32 scalar as torch keeps it
                    state[index]["mu_product"] = torch.tensor(entry["mu_product"], dtype=scalar)
            indices.append(index)
            index += 1
        groups.append({**_FIXED.get(kind, {}), **_hyper(g), "params": indices})
        if kind in _GROUP_STEP:
            groups[-1]["step"] = int(g.get("step", 0))
    return {"state": state, "param_groups": groups}


def _torchao_groups(doc, optimizer):
    groups = _groups_of(doc, optimizer)
    for g in groups:
        if g["optimizer"] not in _TORCHAO_8BIT.values():
            raise ValueError(f"torchao's 8-bit optimizers are Adam and AdamW; the group is {g['optimizer']}")
        if g.get("maximize", False):
            raise ValueError("torchao's 8-bit optimizers have no maximize; the group has maximize=True")
    return groups


def _torchao_hyper(group):
    return {k: (tuple(group[k]) if k == "betas" else group[k]) for k in ("lr", "betas", "eps", "weight_decay",
                                                                         "amsgrad")}


def torchao_param_groups(doc, params, optimizer=None):
    """The param groups of `optimizer` ("AdamW" or "Adam") as torchao's AdamW8bit or
    Adam8bit constructor takes them (torch's keys but maximize, which they lack and which
    must be False)."""
    named = _named(params)
    return [{"params": _params_of(g, named), **_torchao_hyper(g)} for g in _torchao_groups(doc, optimizer)]


def torchao_state_dict(doc, tensors, optimizer=None):
    """The state dict torchao's AdamW8bit or Adam8bit (0.18) made from
    torchao_param_groups(doc, ..., optimizer) loads, from the files of `sxckpt export
    --state-format torchao`: each 8-bit slot an OptimState8bit of its codes and scales
    (signed map for exp_avg, unsigned for the second moments), each param torchao keeps
    in fp32 (fewer than 4096 elements, or not whole blocks of 256) its fp32 tensors, the
    step a float32 tensor, and each group's lr a float32 tensor, as torchao keeps them."""
    from torchao.optim.subclass_8bit import OptimState8bit, get_qmap_signed, get_qmap_unsigned
    state, groups, index = {}, [], 0
    for g in _torchao_groups(doc, optimizer):
        indices = []
        for name in g["params"]:
            entry, st = doc["state"][name], {}
            for key in _STATE_KEYS[g["optimizer"]]:
                plain, codes = tensors.get(f"{name}.{key}"), tensors.get(f"{name}.{key}{_CODES}")
                if codes is not None:
                    signed = key == "exp_avg"
                    qmap = torch.tensor(get_qmap_signed() if signed else get_qmap_unsigned(), dtype=torch.float32)
                    st[key] = OptimState8bit(codes.clone(), tensors[f"{name}.{key}{_SCALE}"].clone(), qmap, signed)
                elif plain is not None:
                    if plain.numel() >= 4096 and plain.numel() % _TORCHAO_BLOCK == 0:
                        raise ValueError(f"{name}.{key} is fp32, but torchao keeps param {name!r} in 8 bits: "
                                         "export with --state-format torchao from a group of 8-bit state")
                    st[key] = plain.float().clone()
            if st:
                state[index] = {"step": torch.tensor(float(entry["step"])), **st}
            indices.append(index)
            index += 1
        hyper = _torchao_hyper(g)
        hyper["lr"] = torch.tensor(hyper["lr"], dtype=torch.float32)
        groups.append({**hyper, "params": indices})
    return {"state": state, "param_groups": groups}


def _kind(opt, group):
    name = type(opt).__name__
    if name in _TORCHAO_8BIT:
        if getattr(opt, "block_size", _TORCHAO_BLOCK) != _TORCHAO_BLOCK or getattr(opt, "bf16_stochastic_round",
                                                                                     False):
            raise ValueError(f"{name} with block_size={opt.block_size} and bf16_stochastic_round="
                             f"{opt.bf16_stochastic_round}: sx's 8-bit state has blocks of {_TORCHAO_BLOCK} and no "
                             "stochastic rounding")
        return _TORCHAO_8BIT[name]
    if name == "Adam" and group.get("decoupled_weight_decay", False):
        return "AdamW"
    if name not in _HYPER_KEYS:
        raise ValueError(f"{name} is not an optimizer sx has ({', '.join(_HYPER_KEYS)})")
    return name


def write(params, optimizers, weights_path, optimizer_prefix=None, step=None):
    """Writes `params` (a Module or {name: param}, in registration order) as
    WEIGHTS_PATH, and, given an OPTIMIZER_PREFIX, the param groups and state of
    `optimizers` (torch's SGD, Adam, AdamW, Adagrad, RMSprop, Adamax, NAdam, RAdam, Muon,
    Adafactor, lion-pytorch's Lion, pytorch-optimizer's Lamb or AdEMAMix, or torchao's
    AdamW8bit or Adam8bit, whose groups get "state_dtype": "8bit" and whose 8-bit slots
    are written as NAME.SLOT.codes and NAME.SLOT.scale) as PREFIX.safetensors and PREFIX.json, for
    `sxckpt import`. Every param must be in one group of one optimizer. `step` is the
    checkpoint's step (default: the largest Adam/AdamW step). torch's SGD counts no
    steps: its params get `step` as their step, and as their momentum_steps where a
    momentum buffer exists (at least 1), else momentum_steps 0. Everything is checked
    before any file is written."""
    named = _named(params)
    if optimizer_prefix is None:
        write_safetensors(weights_path, named, {"writer": "sxckpt_torch.py"})
        return
    name_of = {id(p): n for n, p in named.items()}
    groups, entries = [], {}
    for opt in optimizers:
        for group in opt.param_groups:
            kind = _kind(opt, group)
            hyper = {}
            for key, value in _FIXED.get(kind, {}).items():
                if key in ("max_grad_norm", "foreach") or group.get(key, value) == value:
                    continue  # max_grad_norm acts only with pre_norm; foreach changes no result
                raise ValueError(f"{type(opt).__name__}'s group {len(groups)} has {key}={group[key]!r}; sx's "
                                 f"{kind} follows {key}={value!r}")
            if kind in _CONSTRUCTOR_ONLY and getattr(opt, "pre_norm", False):
                raise ValueError(f"{type(opt).__name__} has pre_norm=True; sx's {kind} has no pre_norm (clip with "
                                 "sx's max_grad_norm)")
            names = _TORCH_NAMES.get(kind, {})
            if kind == "Muon":  # torch's keys into sx's
                group = dict(group)
                group["ns_a"], group["ns_b"], group["ns_c"] = group["ns_coefficients"]
                fn = group.get("adjust_lr_fn")
                group["adjust_lr"] = {None: 0, "original": 0, "match_rms_adamw": 1, "spectral_unclamped": 2}[fn]
            if kind == "Adafactor":  # torch's (eps1, eps2) into sx's eps and eps2
                group = dict(group)
                eps1, group["eps2"] = group["eps"]
                group["eps"] = _ADAFACTOR_EPS1 if eps1 is None else eps1
            if kind == "AdEMAMix":  # its betas (beta1, beta2, beta3); t_alpha_beta3 None is sx's 0
                group = dict(group)
                *group["betas"], group["beta3"] = group["betas"]
                group["t_alpha_beta3"] = group["t_alpha_beta3"] or 0.0
            for key in _HYPER_KEYS[kind]:
                if key in _CONSTRUCTOR_ONLY.get(kind, ()):
                    v = getattr(opt, key)
                elif type(opt).__name__ in _TORCHAO_8BIT and key == "maximize":
                    v = False  # torchao's 8-bit optimizers have none
                else:
                    v = group[names.get(key, key)] if names.get(key, key) in group else _NOT_IN_TORCH[kind][key]
                if key == "betas":
                    hyper[key] = [float(b) for b in v]
                else:  # floats (or 0-d tensors), and the flags as they are
                    hyper[key] = v if isinstance(v, bool) else float(v)
            names = []
            for p in group["params"]:
                if id(p) not in name_of:
                    raise KeyError(f"a param of {type(opt).__name__}'s group {len(groups)} is not among "
                                   "the given params")
                name = name_of[id(p)]
                if name in entries:
                    raise ValueError(f"param {name!r} is in two param groups")
                names.append(name)
                st = opt.state.get(p, {})
                # A class that counts per group: a param with state took its group's steps.
                own = int(st["step"]) if "step" in st else int(group.get("step", 0)) if kind in _GROUP_STEP and st else 0
                entries[name] = {"kind": kind, "step": own,
                                 "trainable": bool(p.requires_grad),
                                 "tensors": {k: st[k] for k in _STATE_KEYS[kind] if st.get(k) is not None}}
                if kind == "NAdam":
                    entries[name]["mu_product"] = float(st["mu_product"]) if "mu_product" in st else 1.0
            groups.append({"optimizer": kind, **hyper, "params": names})
            if type(opt).__name__ in _TORCHAO_8BIT:
                groups[-1]["state_dtype"] = "8bit"
            if kind in _GROUP_STEP:
                groups[-1]["step"] = int(group.get("step", 0))
    unplaced = [n for n in named if n not in entries]
    if unplaced:
        raise ValueError(f"params {unplaced} are in no optimizer's param groups; sx keeps every "
                         "param in one (add the frozen ones to a group)")
    if step is None:
        step = max([e["step"] for e in entries.values() if e["kind"] != "SGD"], default=0)
    state, tensors = {}, {}
    for name in named:  # registration order
        e = entries[name]
        if e["kind"] == "SGD":
            buffer = bool(e["tensors"])
            s = max(step, 1) if buffer else step
            state[name] = {"step": s, "momentum_steps": s if buffer else 0, "trainable": e["trainable"]}
        else:
            state[name] = {"step": e["step"], "trainable": e["trainable"]}
            if "mu_product" in e:
                state[name]["mu_product"] = e["mu_product"]
        for k, t in e["tensors"].items():
            if hasattr(t, "codes") and hasattr(t, "scale"):  # torchao's OptimState8bit
                if t.block_size != _TORCHAO_BLOCK:
                    raise ValueError(f"{name}.{k} has blocks of {t.block_size}; sx's are {_TORCHAO_BLOCK}")
                tensors[f"{name}.{k}{_CODES}"], tensors[f"{name}.{k}{_SCALE}"] = t.codes, t.scale
            else:
                tensors[f"{name}.{k}"] = t
    doc = {"schema_version": SCHEMA_VERSION, "step": step, "param_groups": groups, "state": state}
    text = json.dumps(doc, ensure_ascii=False, allow_nan=False)
    write_safetensors(weights_path, named, {"writer": "sxckpt_torch.py"})
    write_safetensors(optimizer_prefix + ".safetensors", tensors, {"writer": "sxckpt_torch.py"})
    tmp = optimizer_prefix + ".json.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, optimizer_prefix + ".json")
