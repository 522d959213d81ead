//! Hugging Face checkpoints and PEFT adapters out of and into a group's params
//! (include/sx/sx_interop.h, docs/interop.md). Every call is collective: every rank calls
//! it with the same path and root; only the root reads the other options and touches the
//! files.
use std::ffi::CString;
use std::os::raw::c_char;
use std::ptr;

use sx_sys as sys;

use crate::error::{check, cstr_lossy, Result};
use crate::group::ShardGroup;
use crate::options::{c_string, init, Dtype};

/// How [`ShardGroup::export_hf`] and [`ShardGroup::export_peft`] write. The default
/// writes every param under its own name, in fp32, in files of at most 5e9 bytes, from
/// rank 0.
#[derive(Clone, Debug, Default)]
pub struct HfExportOptions {
    pub root: i32,
    /// F32 (None: fp32), Bf16 or F16.
    pub dtype: Option<Dtype>,
    /// export_hf: bytes of tensors per file (0: 5000000000, transformers' "5GB").
    pub max_shard_bytes: u64,
    /// (sx name, key in the files) pairs.
    pub names: Vec<(String, String)>,
    /// Only the params `names` names (export_peft: always).
    pub only_named: bool,
}

/// adapter_config.json's fields (peft's LoraConfig).
#[derive(Clone, Debug, Default)]
pub struct PeftConfig {
    /// None: null (a base model built from a config).
    pub base_model_name_or_path: Option<String>,
    /// "CAUSAL_LM", ... (None: null).
    pub task_type: Option<String>,
    /// "none" (None), "all" or "lora_only".
    pub bias: Option<String>,
    pub target_modules: Vec<String>,
    /// 0: 8.
    pub r: i32,
    /// 0: 8.
    pub lora_alpha: f64,
    pub lora_dropout: f64,
    pub use_rslora: bool,
    pub fan_in_fan_out: bool,
    /// The text of a JSON object of further LoraConfig fields (modules_to_save, ...).
    pub extra_json: Option<String>,
}

/// How [`ShardGroup::import_hf`] matches tensors to params.
#[derive(Clone, Debug, Default)]
pub struct HfImportOptions {
    pub root: i32,
    /// (sx name, key in the files) pairs.
    pub names: Vec<(String, String)>,
    pub only_named: bool,
    /// Params without a tensor keep their values.
    pub allow_missing: bool,
    /// Tensors no param takes are left.
    pub allow_unexpected: bool,
}

/// What an import matched: `missing` holds (sx name, key looked for) pairs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HfImportReport {
    pub loaded: i32,
    pub missing: Vec<(String, String)>,
    pub unexpected: Vec<String>,
}

/// C strings and the pointer array over them, alive as long as this value.
struct CStrings {
    _owned: Vec<CString>,
    ptrs: Vec<*const c_char>,
}

impl CStrings {
    fn new<'a>(what: &str, items: impl Iterator<Item = &'a str>) -> Result<CStrings> {
        let owned = items.map(|s| c_string(what, s)).collect::<Result<Vec<_>>>()?;
        let ptrs = owned.iter().map(|s| s.as_ptr()).collect();
        Ok(CStrings { _owned: owned, ptrs })
    }
    fn ptr(&self) -> *const *const c_char {
        if self.ptrs.is_empty() {
            ptr::null()
        } else {
            self.ptrs.as_ptr()
        }
    }
}

fn name_arrays(names: &[(String, String)]) -> Result<(CStrings, CStrings)> {
    Ok((
        CStrings::new("a name map's sx name", names.iter().map(|p| p.0.as_str()))?,
        CStrings::new("a name map's key", names.iter().map(|p| p.1.as_str()))?,
    ))
}

fn export_options(
    options: &HfExportOptions,
    sx_names: &CStrings,
    file_names: &CStrings,
) -> sys::sx_hf_export_options_t {
    let mut o: sys::sx_hf_export_options_t = init(sys::sx_hf_export_options_init);
    o.root = options.root;
    o.dtype = options.dtype.map(|d| d.raw()).unwrap_or(0);
    o.max_shard_bytes = options.max_shard_bytes;
    o.num_names = options.names.len() as i32;
    o.only_named = options.only_named as i32;
    o.sx_names = sx_names.ptr();
    o.file_names = file_names.ptr();
    o
}

fn optional(what: &str, s: &Option<String>) -> Result<Option<CString>> {
    s.as_deref().map(|s| c_string(what, s)).transpose()
}

fn ptr_of(s: &Option<CString>) -> *const c_char {
    s.as_ref().map(|s| s.as_ptr()).unwrap_or(ptr::null())
}

fn strings(p: *const *const c_char, n: i32) -> Vec<String> {
    (0..n.max(0) as usize).map(|i| cstr_lossy(unsafe { *p.add(i) })).collect()
}

impl ShardGroup {
    /// Collective: writes the params into the new directory `dir` as a Hugging Face
    /// checkpoint (model.safetensors, or model-0000K-of-0000N.safetensors with
    /// model.safetensors.index.json), in a temporary directory renamed into place.
    pub fn export_hf(&mut self, dir: &str, options: &HfExportOptions) -> Result<()> {
        let dir = c_string("dir", dir)?;
        let (a, b) = name_arrays(&options.names)?;
        let o = export_options(options, &a, &b);
        check(unsafe { sys::sx_export_hf(self.raw, dir.as_ptr(), &o) })
    }

    /// Collective: writes a PEFT LoRA adapter into the new directory `dir`: the params
    /// `options.names` names (under peft's keys) into adapter_model.safetensors, and
    /// `config` into adapter_config.json.
    pub fn export_peft(&mut self, dir: &str, options: &HfExportOptions, config: &PeftConfig) -> Result<()> {
        let dir = c_string("dir", dir)?;
        let (a, b) = name_arrays(&options.names)?;
        let o = export_options(options, &a, &b);
        let base = optional("base_model_name_or_path", &config.base_model_name_or_path)?;
        let task = optional("task_type", &config.task_type)?;
        let bias = optional("bias", &config.bias)?;
        let extra = optional("extra_json", &config.extra_json)?;
        let modules = CStrings::new("a target module", config.target_modules.iter().map(|s| s.as_str()))?;
        let mut c: sys::sx_peft_config_t = init(sys::sx_peft_config_init);
        c.base_model_name_or_path = ptr_of(&base);
        c.task_type = ptr_of(&task);
        c.bias = ptr_of(&bias);
        c.extra_json = ptr_of(&extra);
        c.target_modules = modules.ptr();
        c.num_target_modules = config.target_modules.len() as i32;
        c.r = config.r;
        c.lora_alpha = config.lora_alpha;
        c.lora_dropout = config.lora_dropout;
        c.use_rslora = config.use_rslora as i32;
        c.fan_in_fan_out = config.fan_in_fan_out as i32;
        check(unsafe { sys::sx_export_peft(self.raw, dir.as_ptr(), &o, &c) })
    }

    /// Collective: reads a Hugging Face checkpoint (a directory with
    /// model.safetensors.index.json or model.safetensors, an index, or a .safetensors
    /// file) or a PEFT adapter directory into the params by name. The report comes with
    /// the result: also where the call failed for its keys (missing params, tensors no
    /// param takes), the report says which. A failed import changes no param.
    pub fn import_hf(&mut self, path: &str, options: &HfImportOptions) -> (HfImportReport, Result<()>) {
        let path = match c_string("path", path) {
            Ok(p) => p,
            Err(e) => return (HfImportReport::default(), Err(e)),
        };
        let (a, b) = match name_arrays(&options.names) {
            Ok(x) => x,
            Err(e) => return (HfImportReport::default(), Err(e)),
        };
        let mut o: sys::sx_hf_import_options_t = init(sys::sx_hf_import_options_init);
        o.root = options.root;
        o.num_names = options.names.len() as i32;
        o.only_named = options.only_named as i32;
        o.allow_missing = options.allow_missing as i32;
        o.allow_unexpected = options.allow_unexpected as i32;
        o.sx_names = a.ptr();
        o.file_names = b.ptr();
        let mut r: sys::sx_hf_import_report_t = init(sys::sx_hf_import_report_init);
        let status = unsafe { sys::sx_import_hf(self.raw, path.as_ptr(), &o, &mut r) };
        // The names live until this thread's next import: copied at once.
        let names = strings(r.missing, r.num_missing);
        let keys = strings(r.missing_keys, r.num_missing);
        let report = HfImportReport {
            loaded: r.num_loaded,
            missing: names.into_iter().zip(keys).collect(),
            unexpected: strings(r.unexpected, r.num_unexpected),
        };
        (report, check(status))
    }
}
