"""Hugging Face checkpoints and PEFT adapters out of and into a group's params
(sx_interop.h, docs/interop.md).

Every function is collective: every rank of the group calls it with the same path and
root. Only the root reads the other arguments and touches the files.
"""
import ctypes
import dataclasses
import json

from . import _lib
from .errors import InvalidArgumentError, SxError, error
from ._lib import lib

_EXPORT_DTYPES = {None: 0, "f32": _lib.SX_DTYPE_F32, "float32": _lib.SX_DTYPE_F32,
                  "bf16": _lib.SX_DTYPE_BF16, "bfloat16": _lib.SX_DTYPE_BF16,
                  "f16": _lib.SX_DTYPE_F16, "float16": _lib.SX_DTYPE_F16}


@dataclasses.dataclass
class ImportReport:
    """What sx_import_hf matched: how many params took values, the params without a
    tensor (``missing``: (sx name, key looked for) pairs) and the tensors no param took
    (``unexpected``: keys). ``missing_keys`` and ``unexpected_keys`` are torch's
    ``load_state_dict`` names for the two lists (sx names and keys)."""
    loaded: int
    missing: list
    unexpected: list

    @property
    def missing_keys(self):
        return [name for name, _ in self.missing]

    @property
    def unexpected_keys(self):
        return list(self.unexpected)


def _text(what, value):
    if not isinstance(value, str) or not value or "\0" in value:
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                   f"{what} must be a non-empty str without NUL, not {value!r}")
    return value.encode("utf-8")


def _strings(what, values):
    encoded = [_text(what, v) for v in values]
    return (ctypes.c_char_p * max(1, len(encoded)))(*encoded), encoded


def _name_arrays(names):
    """(sx_names, file_names, count, keepalive) of a {sx name: key} mapping or (sx, key) pairs."""
    pairs = list(names.items()) if isinstance(names, dict) else [tuple(p) for p in (names or ())]
    sx_names, keep1 = _strings("an sx name of the name map", [p[0] for p in pairs])
    file_names, keep2 = _strings("a key of the name map", [p[1] for p in pairs])
    return sx_names, file_names, len(pairs), (sx_names, file_names, keep1, keep2)


def _check(status, report=None):
    if status != _lib.SX_OK:
        e = error(status, lib.sx_last_error_message().decode("utf-8", "replace"))
        e.report = report
        raise e


def _dtype(dtype):
    key = dtype if dtype is None or isinstance(dtype, str) else str(dtype).replace("torch.", "")
    if key not in _EXPORT_DTYPES:
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                   f"dtype {dtype!r}: the files take 'f32', 'bf16' or 'f16'")
    return _EXPORT_DTYPES[key]


def _export_options(names, only_named, dtype, max_shard_bytes, root):
    o = _lib.init_struct(_lib.sx_hf_export_options_t)
    sx_names, file_names, count, keep = _name_arrays(names)
    o.root, o.dtype, o.max_shard_bytes = root, _dtype(dtype), int(max_shard_bytes or 0)
    o.num_names, o.only_named = count, 1 if only_named else 0
    o.sx_names, o.file_names = sx_names, file_names
    return o, keep


def export_hf(group, directory, *, names=None, only_named=False, dtype=None, max_shard_bytes=0, root=0):
    """Writes the group's params into the new directory as a Hugging Face checkpoint
    (model.safetensors, or model-0000K-of-0000N.safetensors files with
    model.safetensors.index.json where they pass ``max_shard_bytes``), in dtype "f32"
    (default), "bf16" or "f16". ``names``: {sx name: key} (or pairs); params not named
    keep their names, or with ``only_named`` are left out. Collective."""
    o, keep = _export_options(names, only_named, dtype, max_shard_bytes, root)
    _check(lib.sx_export_hf(group.handle, _text("directory", str(directory)), ctypes.byref(o)))
    del keep


def export_peft(group, directory, names, *, target_modules, base_model_name_or_path=None, r=8, lora_alpha=8,
                lora_dropout=0.0, task_type=None, bias="none", use_rslora=False, fan_in_fan_out=False,
                extra=None, dtype=None, root=0):
    """Writes a PEFT LoRA adapter into the new directory: the params ``names`` names
    ({sx name: peft key}, keys as peft saves them, without the adapter's name) into
    adapter_model.safetensors, and adapter_config.json from the other arguments
    (``extra``: a dict of further LoraConfig fields, e.g. modules_to_save). Collective."""
    o, keep = _export_options(names, True, dtype, 0, root)
    c = _lib.init_struct(_lib.sx_peft_config_t)
    modules, keep_modules = _strings("a target module", list(target_modules))
    c.base_model_name_or_path = (_text("base_model_name_or_path", str(base_model_name_or_path))
                                 if base_model_name_or_path else None)
    c.task_type = _text("task_type", task_type) if task_type is not None else None
    c.bias = _text("bias", bias)
    extra_text = json.dumps(extra).encode("utf-8") if extra else None
    c.extra_json = extra_text
    c.target_modules, c.num_target_modules = modules, len(keep_modules)
    c.r, c.lora_alpha, c.lora_dropout = int(r), float(lora_alpha), float(lora_dropout)
    c.use_rslora, c.fan_in_fan_out = int(bool(use_rslora)), int(bool(fan_in_fan_out))
    _check(lib.sx_export_peft(group.handle, _text("directory", str(directory)), ctypes.byref(o), ctypes.byref(c)))
    del keep, keep_modules, extra_text


def _report(rep):
    text = lambda p: p.decode("utf-8", "replace")  # noqa: E731
    missing = [(text(rep.missing[i]), text(rep.missing_keys[i])) for i in range(rep.num_missing)]
    unexpected = [text(rep.unexpected[i]) for i in range(rep.num_unexpected)]
    return ImportReport(rep.num_loaded, missing, unexpected)


def import_hf(group, path, *, names=None, only_named=False, allow_missing=False, allow_unexpected=False, root=0):
    """Reads a Hugging Face checkpoint (a directory with model.safetensors.index.json or
    model.safetensors, an index, or a .safetensors file) or a PEFT adapter directory into
    the params, by name through ``names`` ({sx name: key}). Returns an
    :class:`ImportReport` (on every rank). Missing params raise NotFoundError and tensors
    no param takes InvalidArgumentError unless allowed, naming them; the exception's
    ``report`` holds the lists. A failed import changes no param. Collective."""
    o = _lib.init_struct(_lib.sx_hf_import_options_t)
    sx_names, file_names, count, keep = _name_arrays(names)
    o.root, o.num_names, o.only_named = root, count, 1 if only_named else 0
    o.sx_names, o.file_names = sx_names, file_names
    o.allow_missing, o.allow_unexpected = int(bool(allow_missing)), int(bool(allow_unexpected))
    rep = _lib.init_struct(_lib.sx_hf_import_report_t)
    status = lib.sx_import_hf(group.handle, _text("path", str(path)), ctypes.byref(o), ctypes.byref(rep))
    report = _report(rep)  # before any other sx call on this thread replaces the names
    del keep
    _check(status, report)
    return report


__all__ = ["ImportReport", "export_hf", "export_peft", "import_hf", "SxError"]
