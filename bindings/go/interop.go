package sx

/*
#include <stdlib.h>
#include "sx/sx.h"
*/
import "C"

import (
	"encoding/json"
	"unsafe"
)

// Hugging Face checkpoints and PEFT adapters out of and into a group's params
// (include/sx/sx_interop.h, docs/interop.md). Every call is collective: every rank calls
// it with the same path and Root; only the root reads the other fields and touches the
// files.

// NamePair takes a param (its sx name) to its key in the files.
type NamePair struct {
	SxName, FileName string
}

// HFExportOptions says how ExportHF and ExportPEFT write. The zero value writes every
// param under its own name, in fp32, in files of at most 5e9 bytes, from rank 0.
type HFExportOptions struct {
	Root          int32
	DType         Dtype  // DtypeF32 (0: fp32), DtypeBF16 or DtypeF16
	MaxShardBytes uint64 // ExportHF: bytes of tensors per file (0: 5000000000, transformers' "5GB")
	Names         []NamePair
	OnlyNamed     bool // only the params Names names (ExportPEFT: always)
}

// PEFTConfig is what adapter_config.json says (peft's LoraConfig fields).
type PEFTConfig struct {
	BaseModelNameOrPath string   // "": null (a base model built from a config)
	TaskType            string   // "CAUSAL_LM", ... ("": null)
	Bias                string   // "none" (""), "all" or "lora_only"
	TargetModules       []string // required
	R                   int32    // 0: 8
	LoraAlpha           float64  // 0: 8
	LoraDropout         float64
	UseRSLoRA           bool
	FanInFanOut         bool
	Extra               map[string]interface{} // further LoraConfig fields (modules_to_save, ...)
}

// HFImportOptions says how ImportHF matches tensors to params.
type HFImportOptions struct {
	Root            int32
	Names           []NamePair
	OnlyNamed       bool // only the params Names names take part
	AllowMissing    bool // params without a tensor keep their values
	AllowUnexpected bool // tensors no param takes are left
}

// HFImportReport is what ImportHF matched: Missing holds (sx name, key looked for) pairs.
type HFImportReport struct {
	Loaded     int32
	Missing    []NamePair
	Unexpected []string
}

// cStrings copies ss into C memory (a struct passed to C may not point at Go memory).
func cStrings(what string, ss []string) (**C.char, func(), error) {
	if len(ss) == 0 {
		return nil, func() {}, nil
	}
	for _, s := range ss {
		if err := noNUL(what, s); err != nil {
			return nil, nil, err
		}
	}
	arr := (*[1 << 28]*C.char)(C.malloc(C.size_t(len(ss)) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))[:len(ss):len(ss)]
	for i, s := range ss {
		arr[i] = C.CString(s)
	}
	free := func() {
		for _, p := range arr {
			C.free(unsafe.Pointer(p))
		}
		C.free(unsafe.Pointer(&arr[0]))
	}
	return &arr[0], free, nil
}

func nameArrays(names []NamePair) (**C.char, **C.char, func(), error) {
	sxNames, fileNames := make([]string, len(names)), make([]string, len(names))
	for i, p := range names {
		sxNames[i], fileNames[i] = p.SxName, p.FileName
	}
	a, freeA, err := cStrings("a name map's sx name", sxNames)
	if err != nil {
		return nil, nil, nil, err
	}
	b, freeB, err := cStrings("a name map's key", fileNames)
	if err != nil {
		freeA()
		return nil, nil, nil, err
	}
	return a, b, func() { freeA(); freeB() }, nil
}

func exportOptions(opts HFExportOptions, o *C.sx_hf_export_options_t) (func(), error) {
	C.sx_hf_export_options_init(o, C.size_t(unsafe.Sizeof(*o)))
	a, b, free, err := nameArrays(opts.Names)
	if err != nil {
		return nil, err
	}
	o.root, o.dtype, o.max_shard_bytes = C.int32_t(opts.Root), C.int32_t(opts.DType), C.uint64_t(opts.MaxShardBytes)
	o.num_names, o.only_named = C.int32_t(len(opts.Names)), cbool(opts.OnlyNamed)
	o.sx_names, o.file_names = a, b
	return free, nil
}

// ExportHF writes the params into the new directory dir as a Hugging Face checkpoint
// (model.safetensors, or model-0000K-of-0000N.safetensors with model.safetensors.index.json),
// written into a temporary directory and renamed into place. Collective.
func (g *ShardGroup) ExportHF(dir string, opts HFExportOptions) error {
	if err := noNUL("dir", dir); err != nil {
		return err
	}
	var o C.sx_hf_export_options_t
	free, err := exportOptions(opts, &o)
	if err != nil {
		return err
	}
	defer free()
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	return g.do(func(r *C.sx_shard_group_t) C.sx_status_t { return C.sx_export_hf(r, cdir, &o) })
}

// ExportPEFT writes a PEFT LoRA adapter into the new directory dir: the params
// opts.Names names (under peft's keys) into adapter_model.safetensors and cfg into
// adapter_config.json. Collective.
func (g *ShardGroup) ExportPEFT(dir string, opts HFExportOptions, cfg PEFTConfig) error {
	for what, s := range map[string]string{"dir": dir, "BaseModelNameOrPath": cfg.BaseModelNameOrPath,
		"TaskType": cfg.TaskType, "Bias": cfg.Bias} {
		if err := noNUL(what, s); err != nil {
			return err
		}
	}
	var o C.sx_hf_export_options_t
	free, err := exportOptions(opts, &o)
	if err != nil {
		return err
	}
	defer free()
	var c C.sx_peft_config_t
	C.sx_peft_config_init(&c, C.size_t(unsafe.Sizeof(c)))
	modules, freeModules, err := cStrings("a target module", cfg.TargetModules)
	if err != nil {
		return err
	}
	defer freeModules()
	c.target_modules, c.num_target_modules = modules, C.int32_t(len(cfg.TargetModules))
	var texts []*C.char
	defer func() {
		for _, p := range texts {
			C.free(unsafe.Pointer(p))
		}
	}()
	text := func(s string) *C.char {
		if s == "" {
			return nil
		}
		p := C.CString(s)
		texts = append(texts, p)
		return p
	}
	c.base_model_name_or_path, c.task_type, c.bias = text(cfg.BaseModelNameOrPath), text(cfg.TaskType), text(cfg.Bias)
	if len(cfg.Extra) > 0 {
		extra, err := json.Marshal(cfg.Extra)
		if err != nil {
			return errorf(ErrInvalidArgument, "PEFTConfig.Extra: %v", err)
		}
		c.extra_json = text(string(extra))
	}
	c.r, c.lora_alpha, c.lora_dropout = C.int32_t(cfg.R), C.double(cfg.LoraAlpha), C.double(cfg.LoraDropout)
	c.use_rslora, c.fan_in_fan_out = cbool(cfg.UseRSLoRA), cbool(cfg.FanInFanOut)
	cdir := text(dir)
	return g.do(func(r *C.sx_shard_group_t) C.sx_status_t { return C.sx_export_peft(r, cdir, &o, &c) })
}

// ImportHF reads a Hugging Face checkpoint (a directory with model.safetensors.index.json
// or model.safetensors, an index, or a .safetensors file) or a PEFT adapter directory
// into the params by name. The report is filled on every rank, also where the call
// failed for its keys (ErrNotFound: params without a tensor; ErrInvalidArgument: tensors
// no param takes). A failed import changes no param. Collective.
func (g *ShardGroup) ImportHF(path string, opts HFImportOptions) (HFImportReport, error) {
	var report HFImportReport
	if err := noNUL("path", path); err != nil {
		return report, err
	}
	var o C.sx_hf_import_options_t
	C.sx_hf_import_options_init(&o, C.size_t(unsafe.Sizeof(o)))
	a, b, free, err := nameArrays(opts.Names)
	if err != nil {
		return report, err
	}
	defer free()
	o.root, o.num_names, o.only_named = C.int32_t(opts.Root), C.int32_t(len(opts.Names)), cbool(opts.OnlyNamed)
	o.sx_names, o.file_names = a, b
	o.allow_missing, o.allow_unexpected = cbool(opts.AllowMissing), cbool(opts.AllowUnexpected)
	var rep C.sx_hf_import_report_t
	C.sx_hf_import_report_init(&rep, C.size_t(unsafe.Sizeof(rep)))
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	err = g.do(func(r *C.sx_shard_group_t) C.sx_status_t {
		s := C.sx_import_hf(r, cpath, &o, &rep)
		// The names live until this thread's next import: copied while the thread is ours.
		report = importReport(&rep)
		return s
	})
	return report, err
}

func importReport(rep *C.sx_hf_import_report_t) HFImportReport {
	out := HFImportReport{Loaded: int32(rep.num_loaded)}
	if n := int(rep.num_missing); n > 0 {
		names := (*[1 << 28]*C.char)(unsafe.Pointer(rep.missing))[:n:n]
		keys := (*[1 << 28]*C.char)(unsafe.Pointer(rep.missing_keys))[:n:n]
		for i := 0; i < n; i++ {
			out.Missing = append(out.Missing, NamePair{C.GoString(names[i]), C.GoString(keys[i])})
		}
	}
	if n := int(rep.num_unexpected); n > 0 {
		keys := (*[1 << 28]*C.char)(unsafe.Pointer(rep.unexpected))[:n:n]
		for i := 0; i < n; i++ {
			out.Unexpected = append(out.Unexpected, C.GoString(keys[i]))
		}
	}
	return out
}
