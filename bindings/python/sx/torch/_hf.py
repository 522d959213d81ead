"""ShardedOptimizer's params as Hugging Face checkpoints and PEFT adapters, and back
(sx_interop.h, docs/interop.md): ``save_pretrained`` and ``load_pretrained`` as
transformers' and torch's ``state_dict`` names them, ``save_adapter`` and ``load_adapter``
as peft's. Each is collective (every process calls it); rank 0 writes and reads the files."""
import collections
import re

import torch

from .. import interop as _interop
from ..errors import InvalidArgumentError
from .. import _lib

# torch's Module.load_state_dict result, with the same fields.
IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])

_DTYPES = {None: None, torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
           "f32": "f32", "bf16": "bf16", "f16": "f16", "float32": "f32", "bfloat16": "bf16", "float16": "f16"}
# peft's LoraConfig fields sx_peft_config_t carries; the other JSON-serializable fields go
# to extra_json as they are.
_PEFT_FIELDS = ("peft_type", "base_model_name_or_path", "task_type", "r", "lora_alpha", "lora_dropout",
                "target_modules", "bias", "use_rslora", "fan_in_fan_out", "inference_mode")


def _bytes(size):
    """transformers' max_shard_size: an int of bytes, or "5GB", "200MB", "10KiB"..."""
    if size is None:
        return 0
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B\s*", str(size).upper().replace("IB", "iB"), re.I)
    if not m:
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT, f"max_shard_size {size!r}: say e.g. 5GB or 200MB")
    base = 1024 if m.group(3) else 1000
    return int(float(m.group(1)) * base ** " KMGT".index(m.group(2) or " "))


def _keys(names, key_map):
    """{sx name: key} for the params that take part: key_map a dict (names it lacks keep
    theirs), a callable (None: the param is left out) or None (every name as it is)."""
    if key_map is None:
        return {n: n for n in names}
    if callable(key_map):
        out = {}
        for n in names:
            k = key_map(n)
            if k is not None:
                out[n] = k
        return out
    return {n: key_map.get(n, n) for n in names}


def _peft_keys(names, adapter_name):
    """peft's keys of the adapter's params: its name taken out ("...lora_A.default.weight"
    -> "...lora_A.weight"), as get_peft_model_state_dict saves them."""
    marker = "." + adapter_name
    out = {}
    for n in names:
        if marker + "." in n or n.endswith(marker):
            if any(t in n for t in ("lora_", "modules_to_save")):
                out[n] = n.replace(marker + ".", ".") if marker + "." in n else n[: -len(marker)]
    return out


class _HF:
    """Hugging Face checkpoints and PEFT adapters of ShardedOptimizer's params."""

    def save_pretrained(self, save_directory, *, key_map=None, dtype=None, max_shard_size="5GB"):
        """Collective: writes the params into the new directory as transformers'
        ``save_pretrained`` does (safetensors, sharded over ``max_shard_size`` with
        model.safetensors.index.json), in ``dtype`` (torch.float32, bfloat16 or float16;
        None: fp32), under ``key_map``'s names (a dict, or a callable returning None for
        params to leave out; e.g. ``lambda n: n.removeprefix("base_model.model.")``).
        Values are sx's: the fp32 masters of 16-bit params. Buffers are not written."""
        if dtype not in _DTYPES:
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT, f"dtype {dtype!r}: float32, bfloat16 or float16")
        names = _keys(self._names, key_map)
        _interop.export_hf(self.group, str(save_directory), names=names, only_named=True,
                           dtype=_DTYPES[dtype], max_shard_bytes=_bytes(max_shard_size))

    def load_pretrained(self, path, *, key_map=None, strict=True):
        """Collective: reads a Hugging Face checkpoint (a directory as ``save_pretrained``
        writes it, sharded or not, fp32, bf16 or fp16, or one .safetensors file) into the
        params by name (``key_map`` as for save_pretrained), as ``load_state_dict`` would;
        returns ``IncompatibleKeys(missing_keys, unexpected_keys)`` (sx names, file keys).
        ``strict=True`` raises, naming them, where either list is not empty, and then
        changes nothing."""
        names = _keys(self._names, key_map)
        report = _interop.import_hf(self.group, str(path), names=names, only_named=True,
                                    allow_missing=not strict, allow_unexpected=not strict)
        self._after_import()
        return IncompatibleKeys(report.missing_keys, report.unexpected_keys)

    def save_adapter(self, save_directory, peft_config, *, adapter_name="default", dtype=None):
        """Collective: writes the LoRA adapter ``adapter_name`` of a PEFT model (the params
        named "...lora_A.<adapter_name>.weight" and the like) as peft's ``save_pretrained``
        does: adapter_model.safetensors under peft's keys, and ``peft_config`` (a
        LoraConfig, or its dict) as adapter_config.json. ``PeftModel.from_pretrained``
        loads it onto its base model."""
        config = peft_config.to_dict() if hasattr(peft_config, "to_dict") else dict(peft_config)
        names = _peft_keys(self._names, adapter_name)
        if not names:
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                       f"no param of adapter {adapter_name!r} (named '...lora_A.{adapter_name}...')")
        peft_type = str(getattr(config.get("peft_type"), "value", config.get("peft_type") or "LORA"))
        if peft_type != "LORA":
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT, f"peft_type {peft_type}: sx writes LoRA adapters")
        extra = {}
        for k, v in config.items():
            if k in _PEFT_FIELDS:
                continue
            v = sorted(v) if isinstance(v, set) else v
            v = getattr(v, "value", v)
            try:
                import json
                json.dumps(v)
            except TypeError:
                continue  # not JSON (peft itself leaves such fields out of its file)
            extra[k] = v
        targets = config.get("target_modules")
        targets = sorted(targets) if isinstance(targets, (set, list, tuple)) else [targets]
        task = config.get("task_type")
        _interop.export_peft(self.group, str(save_directory), names,
                             base_model_name_or_path=config.get("base_model_name_or_path") or None,
                             target_modules=targets, r=config.get("r", 8), lora_alpha=config.get("lora_alpha", 8),
                             lora_dropout=config.get("lora_dropout", 0.0),
                             task_type=None if task is None else str(getattr(task, "value", task)),
                             bias=config.get("bias", "none"), use_rslora=config.get("use_rslora", False),
                             fan_in_fan_out=config.get("fan_in_fan_out", False), extra=extra,
                             dtype=_DTYPES[dtype])

    def load_adapter(self, path, *, adapter_name="default", strict=True):
        """Collective: reads a PEFT adapter directory (adapter_model.safetensors, as
        peft's save_pretrained writes it) into the params of adapter ``adapter_name``;
        returns ``IncompatibleKeys`` as load_pretrained."""
        names = _peft_keys(self._names, adapter_name)
        report = _interop.import_hf(self.group, str(path), names=names, only_named=True,
                                    allow_missing=not strict, allow_unexpected=not strict)
        self._after_import()
        return IncompatibleKeys(report.missing_keys, report.unexpected_keys)

    def _after_import(self):
        """The params' tensors are views of sx's memory, which the import wrote: nothing
        to copy. At stage 3 the next gather shows the new values."""
