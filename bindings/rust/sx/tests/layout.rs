//! Every #[repr(C)] mirror in sx-sys and every constant, against sx_layout.json (the C
//! compiler's view of include/sx/sx.h), read from $SX_LAYOUT_JSON.
use std::collections::BTreeMap;
use std::mem::{align_of, size_of, size_of_val};

use sx::sys;

/// Just enough JSON for sx_layout.json: objects, arrays, strings without escapes
/// beyond \" and \\, integers.
#[derive(Debug, Clone)]
enum Json {
    Obj(BTreeMap<String, Json>),
    Arr(Vec<Json>),
    Str(String),
    Num(i64),
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while self.i < self.s.len() && (self.s[self.i] as char).is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn expect(&mut self, c: u8) {
        self.ws();
        assert_eq!(self.s.get(self.i).copied(), Some(c), "JSON: expected '{}' at byte {}", c as char, self.i);
        self.i += 1;
    }
    fn peek(&mut self) -> u8 {
        self.ws();
        *self.s.get(self.i).unwrap_or_else(|| panic!("JSON: unexpected end"))
    }
    fn string(&mut self) -> String {
        self.expect(b'"');
        let mut out = String::new();
        while self.s[self.i] != b'"' {
            if self.s[self.i] == b'\\' {
                self.i += 1;
            }
            out.push(self.s[self.i] as char);
            self.i += 1;
        }
        self.i += 1;
        out
    }
    fn value(&mut self) -> Json {
        match self.peek() {
            b'{' => {
                self.i += 1;
                let mut m = BTreeMap::new();
                if self.peek() == b'}' {
                    self.i += 1;
                    return Json::Obj(m);
                }
                loop {
                    let k = self.string();
                    self.expect(b':');
                    m.insert(k, self.value());
                    if self.peek() == b',' {
                        self.i += 1;
                    } else {
                        self.expect(b'}');
                        return Json::Obj(m);
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut v = Vec::new();
                if self.peek() == b']' {
                    self.i += 1;
                    return Json::Arr(v);
                }
                loop {
                    v.push(self.value());
                    if self.peek() == b',' {
                        self.i += 1;
                    } else {
                        self.expect(b']');
                        return Json::Arr(v);
                    }
                }
            }
            b'"' => Json::Str(self.string()),
            _ => {
                let start = self.i;
                while self.i < self.s.len() && (self.s[self.i] == b'-' || self.s[self.i].is_ascii_digit()) {
                    self.i += 1;
                }
                let t = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                Json::Num(t.parse().unwrap_or_else(|_| panic!("JSON: bad number {:?} at byte {}", t, start)))
            }
        }
    }
}

impl Json {
    fn get(&self, k: &str) -> &Json {
        match self {
            Json::Obj(m) => m.get(k).unwrap_or_else(|| panic!("sx_layout.json: no key {:?}", k)),
            _ => panic!("sx_layout.json: {:?} looked up in a non-object", k),
        }
    }
    fn num(&self) -> i64 {
        match self {
            Json::Num(n) => *n,
            other => panic!("sx_layout.json: expected a number, got {:?}", other),
        }
    }
    fn obj(&self) -> &BTreeMap<String, Json> {
        match self {
            Json::Obj(m) => m,
            other => panic!("sx_layout.json: expected an object, got {:?}", other),
        }
    }
    fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(v) => v,
            other => panic!("sx_layout.json: expected an array, got {:?}", other),
        }
    }
    fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            other => panic!("sx_layout.json: expected a string, got {:?}", other),
        }
    }
}

fn layout() -> Json {
    let path = std::env::var("SX_LAYOUT_JSON")
        .expect("set SX_LAYOUT_JSON to build/<dir>/bindings/sx_layout.json (the build writes it)");
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {}", path, e));
    let mut p = Parser { s: &text, i: 0 };
    p.value()
}

/// (name, offset, size) of each field, measured on a zeroed value (all mirrors are
/// plain data for which all-zero bytes are valid: integers, floats, raw pointers,
/// Option<fn>).
macro_rules! mirror {
    ($t:ty, [$($f:ident),* $(,)?]) => {{
        let v: $t = unsafe { std::mem::zeroed() };
        let base = &v as *const $t as usize;
        let fields: Vec<(&str, usize, usize)> = vec![
            $((stringify!($f), &v.$f as *const _ as usize - base, size_of_val(&v.$f))),*
        ];
        (stringify!($t).rsplit("::").next().unwrap().trim().to_string(), size_of::<$t>(), align_of::<$t>(), fields)
    }};
}

#[test]
fn structs_match_the_c_layout() {
    let json = layout();
    let structs = json.get("structs").obj();
    let mirrors = vec![
        mirror!(sys::sx_group_config_t, [struct_size, rendezvous, rank, world_size, stage, backend, num_threads,
            alignment, timeout_ms, flags, bind_address, device_ordinal, reserved0, grad_dtype, reduce_dtype,
            prefetch_depth, shard_size, grad_predivide_factor, trace_path, trace_events, transport,
            rendezvous_token, rendezvous_bind, memory_copy_interval, offload, reserved1, context, name]),
        mirror!(sys::sx_param_group_desc_t, [struct_size, optimizer, nesterov, maximize, amsgrad, lr, weight_decay,
            beta1, beta2, eps, momentum, dampening, centered, decoupled_weight_decay, lr_decay,
            initial_accumulator_value, alpha, momentum_decay, ns_a, ns_b, ns_c, ns_steps, adjust_lr, beta2_decay,
            eps2, d, beta3, t_alpha_beta3, state_dtype, bf16_stochastic_round]),
        mirror!(sys::sx_param_desc_t, [struct_size, name, ndim, dtype, shape, param_group, unit, frozen, reserved0, placement, split_dim, global_shape, split_offset, replica, replicas]),
        mirror!(sys::sx_view_t, [struct_size, data, numel, dtype, device]),
        mirror!(sys::sx_step_options_t, [struct_size, max_grad_norm, stream, keep_grads, defer_gather, weighted,
            reserved0, weight, nonfinite, reserved1]),
        mirror!(sys::sx_unit_ready_options_t, [struct_size, accumulate, reserved0, stream]),
        mirror!(sys::sx_step_result_t, [struct_size, grad_norm, step, skipped, reserved0, loss_scale, nonfinite,
            reserved1]),
        mirror!(sys::sx_loss_scaling_t, [struct_size, mode, growth_interval, init_scale, growth_factor,
            backoff_factor]),
        mirror!(sys::sx_memory_stats_t, [struct_size, param_bytes, grad_bytes, optimizer_bytes, staging_bytes,
            unsharded_optimizer_bytes, peak_param_bytes, memory_copy_bytes, device_bytes]),
        mirror!(sys::sx_param_info_t, [struct_size, name, ndim, dtype, shape, numel, param_group, unit, trainable,
            reserved0, offset_in_unit, shard_begin, shard_end]),
        mirror!(sys::sx_unit_info_t, [struct_size, unit, num_params, numel, padded_numel, shard_numel, shard_begin,
            trainable, has_optimizer_state, shard_size, shard_rank, replicas, replica_rank]),
        mirror!(sys::sx_save_options_t, [struct_size, path, user_blob, user_blob_size, keep_last, synchronous,
            callback, callback_user]),
        mirror!(sys::sx_load_options_t, [struct_size, path, flags, reserved0]),
        mirror!(sys::sx_regroup_options_t, [struct_size, checkpoint, load_flags, join_window_ms,
            expected_world_size, admit]),
        mirror!(sys::sx_regroup_result_t, [struct_size, epoch, rank, world_size, shard_size, previous_rank,
            previous_world_size, step, from_memory, reserved0]),
        mirror!(sys::sx_param_state_t, [struct_size, param, param_group, name, numel, step, momentum_steps,
            num_tensors, reserved0, tensor_names, tensors, mu_product, tensor_numels]),
        mirror!(sys::sx_optimizer_piece_t, [struct_size, param, grad, state, n, grad_scale, param_index,
            param_group, offset, step, hyperparameters, user_data, num_slots, num_hyperparameters, error,
            error_size]),
        mirror!(sys::sx_optimizer_hyperparameter_t, [name, default_value, min, max]),
        mirror!(sys::sx_context_config_t, [struct_size, rendezvous, rank, world_size, backend, num_threads,
            timeout_ms, transport, bind_address, rendezvous_token, rendezvous_bind, device_ordinal, reserved0,
            memory_budget_bytes]),
        mirror!(sys::sx_context_stats_t, [struct_size, groups, groups_created, channels, memory_bytes,
            memory_budget_bytes, shared_memory, reserved0, transport_bytes]),
        mirror!(sys::sx_optimizer_desc_t, [struct_size, name, num_slots, slot_names, slot_initial_values,
            num_hyperparameters, hyperparameters, update, user_data, flags, reserved0]),
        mirror!(sys::sx_hf_export_options_t, [struct_size, root, dtype, max_shard_bytes, num_names, only_named,
            sx_names, file_names]),
        mirror!(sys::sx_peft_config_t, [struct_size, base_model_name_or_path, task_type, bias, extra_json,
            target_modules, num_target_modules, r, lora_alpha, lora_dropout, use_rslora, fan_in_fan_out]),
        mirror!(sys::sx_hf_import_options_t, [struct_size, root, num_names, only_named, allow_missing,
            allow_unexpected, reserved0, sx_names, file_names]),
        mirror!(sys::sx_hf_import_report_t, [struct_size, num_loaded, num_missing, num_unexpected, reserved0,
            missing, missing_keys, unexpected]),
    ];
    let mut problems = Vec::new();
    for (name, size, align, fields) in &mirrors {
        let c = match structs.get(name) {
            Some(c) => c,
            None => {
                problems.push(format!("{}: mirrored in sx-sys but absent from sx.h", name));
                continue;
            }
        };
        if c.get("size").num() as usize != *size {
            problems.push(format!("{}: size {} in Rust, {} in C", name, size, c.get("size").num()));
        }
        if c.get("align").num() as usize != *align {
            problems.push(format!("{}: align {} in Rust, {} in C", name, align, c.get("align").num()));
        }
        let c_fields = c.get("fields").arr();
        let c_names: Vec<&str> = c_fields.iter().map(|f| f.get("name").str()).collect();
        let r_names: Vec<&str> = fields.iter().map(|f| f.0).collect();
        if c_names != r_names {
            problems.push(format!("{}: fields {:?} in Rust, {:?} in C", name, r_names, c_names));
            continue;
        }
        for (f, (fname, off, sz)) in c_fields.iter().zip(fields) {
            let (co, cs) = (f.get("offset").num() as usize, f.get("size").num() as usize);
            if (co, cs) != (*off, *sz) {
                problems.push(format!("{}.{}: offset {} size {} in Rust, offset {} size {} in C", name, fname, off, sz, co, cs));
            }
        }
    }
    for name in structs.keys() {
        if !mirrors.iter().any(|m| &m.0 == name) {
            problems.push(format!("{}: declared in sx.h but not mirrored in sx-sys", name));
        }
    }
    assert!(problems.is_empty(), "layout differs from sx.h:\n{}", problems.join("\n"));
}

macro_rules! constants {
    ($($c:ident),* $(,)?) => { vec![$((stringify!($c), sys::$c as i64)),*] };
}

#[test]
fn constants_match_the_header() {
    let json = layout();
    let c = json.get("constants").obj();
    let ours: Vec<(&str, i64)> = constants!(
        SX_VERSION_MAJOR, SX_VERSION_MINOR, SX_VERSION_PATCH, SX_VERSION_NUMBER,
        SX_OK, SX_ERR_INVALID_ARGUMENT, SX_ERR_INVALID_HANDLE, SX_ERR_INVALID_STATE, SX_ERR_OUT_OF_MEMORY,
        SX_ERR_NOT_FOUND, SX_ERR_ALREADY_EXISTS, SX_ERR_UNSUPPORTED, SX_ERR_TIMEOUT, SX_ERR_COMM,
        SX_ERR_GROUP_FAILED, SX_ERR_IO, SX_ERR_CORRUPT, SX_ERR_VERSION, SX_ERR_ABORTED, SX_ERR_MISMATCH,
        SX_ERR_INTERNAL, SX_ERR_CANCELLED, SX_ERR_NONFINITE, SX_ERR_OPTIMIZER,
        SX_LOG_ERROR, SX_LOG_WARN, SX_LOG_INFO, SX_LOG_DEBUG,
        SX_DTYPE_F32, SX_DTYPE_F16, SX_DTYPE_BF16, SX_DTYPE_U8,
        SX_BACKEND_AUTO, SX_BACKEND_CPU, SX_BACKEND_CUDA, SX_DEVICE_CPU, SX_DEVICE_CUDA,
        SX_OFFLOAD_NONE, SX_OFFLOAD_STATE,
        SX_OPTIM_SGD, SX_OPTIM_ADAM, SX_OPTIM_ADAMW, SX_OPTIM_ADAGRAD, SX_OPTIM_RMSPROP, SX_OPTIM_ADAMAX,
        SX_OPTIM_NADAM, SX_OPTIM_RADAM, SX_OPTIM_LION, SX_OPTIM_LAMB, SX_OPTIM_MUON, SX_OPTIM_ADAFACTOR,
        SX_OPTIM_ADEMAMIX,
        SX_OPTIM_CUSTOM_FIRST, SX_HP_CUSTOM, SX_MAX_CUSTOM_SLOTS, SX_MAX_CUSTOM_HYPERPARAMETERS, SX_MAX_CUSTOM_OPTIMIZERS,
        SX_OPTIMIZER_ERROR_BYTES, SX_OPTIMIZER_IN_PLACE,
        SX_HP_LR, SX_HP_WEIGHT_DECAY, SX_HP_BETA1, SX_HP_BETA2, SX_HP_EPS, SX_HP_MOMENTUM, SX_HP_DAMPENING,
        SX_HP_NESTEROV, SX_HP_MAXIMIZE, SX_HP_AMSGRAD, SX_HP_LR_DECAY, SX_HP_INITIAL_ACCUMULATOR_VALUE,
        SX_HP_ALPHA, SX_HP_CENTERED, SX_HP_MOMENTUM_DECAY, SX_HP_DECOUPLED_WEIGHT_DECAY,
        SX_HP_NS_A, SX_HP_NS_B, SX_HP_NS_C, SX_HP_NS_STEPS, SX_HP_ADJUST_LR, SX_HP_BETA2_DECAY, SX_HP_EPS2, SX_HP_D,
        SX_HP_BETA3, SX_HP_T_ALPHA_BETA3, SX_HP_STATE_DTYPE, SX_HP_BF16_STOCHASTIC_ROUND,
        SX_STATE_FP32, SX_STATE_BF16, SX_STATE_8BIT,
        SX_MUON_ADJUST_LR_ORIGINAL, SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW, SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED,
        SX_GROUP_NO_TRAINABLE_AUTODETECT, SX_GROUP_RESERVE_CHECKPOINT_STAGING, SX_GROUP_JOIN,
        SX_GROUP_MEMORY_COPY_WAIT, SX_GROUP_OPENMP_THREADS, SX_MAX_NDIM, SX_MAX_NAME_BYTES, SX_MAX_WORLD_SIZE,
        SX_LOAD_PARAMS_ONLY, SX_LOAD_ALLOW_MISSING, SX_LOAD_ALLOW_EXTRA,
        SX_LOSS_SCALING_NONE, SX_LOSS_SCALING_DYNAMIC, SX_LOSS_SCALING_STATIC,
        SX_NONFINITE_DEFAULT, SX_NONFINITE_SKIP, SX_NONFINITE_ERROR,
        SX_REDUCE_SUM, SX_REDUCE_MEAN, SX_REDUCE_MAX, SX_REDUCE_MIN, SX_MAX_ALL_REDUCE,
        SX_PREFETCH_NONE, SX_TRANSPORT_AUTO, SX_TRANSPORT_TCP,
        SX_PLACEMENT_WHOLE, SX_PLACEMENT_REPLICATED, SX_PLACEMENT_SPLIT,
    );
    let mut problems = Vec::new();
    for (name, value) in &ours {
        match c.get(*name) {
            Some(v) if v.num() == *value => {}
            Some(v) => problems.push(format!("{} is {} in Rust, {} in C", name, value, v.num())),
            None => problems.push(format!("{} is defined in sx-sys but not in sx.h", name)),
        }
    }
    for name in c.keys() {
        if !ours.iter().any(|(n, _)| n == name) {
            problems.push(format!("{} is defined in sx.h but not in sx-sys", name));
        }
    }
    let v = json.get("version").arr();
    assert_eq!((v[0].num(), v[1].num()), (sys::SX_VERSION_MAJOR as i64, sys::SX_VERSION_MINOR as i64));
    assert_eq!(json.get("pointer_size").num() as usize, size_of::<*const u8>());
    assert!(problems.is_empty(), "constants differ from sx.h:\n{}", problems.join("\n"));
}
