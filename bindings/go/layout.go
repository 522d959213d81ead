package sx

/*
#include "sx/sx.h"
*/
import "C"

import "unsafe"

// The layout of every public struct as this package compiled it (cgo reads sx.h
// through CGO_CFLAGS), for the test that compares it against sx_layout.json: a header
// other than the library's own, or a struct the binding does not know, fails there.
// (Test files cannot use cgo, so the table lives here.)

type fieldLayout struct {
	name         string
	offset, size uintptr
}

type structLayout struct {
	name        string
	size, align uintptr
	fields      []fieldLayout
}

func f(name string, offset, size uintptr) fieldLayout { return fieldLayout{name, offset, size} }

func cLayouts() []structLayout {
	var gc C.sx_group_config_t
	var pg C.sx_param_group_desc_t
	var pd C.sx_param_desc_t
	var v C.sx_view_t
	var so C.sx_step_options_t
	var ur C.sx_unit_ready_options_t
	var sr C.sx_step_result_t
	var ls C.sx_loss_scaling_t
	var ms C.sx_memory_stats_t
	var pi C.sx_param_info_t
	var ui C.sx_unit_info_t
	var sv C.sx_save_options_t
	var lo C.sx_load_options_t
	var ro C.sx_regroup_options_t
	var rr C.sx_regroup_result_t
	var ps C.sx_param_state_t
	var op C.sx_optimizer_piece_t
	var oh C.sx_optimizer_hyperparameter_t
	var od C.sx_optimizer_desc_t
	var he C.sx_hf_export_options_t
	var pc C.sx_peft_config_t
	var hi C.sx_hf_import_options_t
	var hr C.sx_hf_import_report_t
	var cc C.sx_context_config_t
	var cs C.sx_context_stats_t
	return []structLayout{
		{"sx_group_config_t", unsafe.Sizeof(gc), unsafe.Alignof(gc), []fieldLayout{
			f("struct_size", unsafe.Offsetof(gc.struct_size), unsafe.Sizeof(gc.struct_size)),
			f("rendezvous", unsafe.Offsetof(gc.rendezvous), unsafe.Sizeof(gc.rendezvous)),
			f("rank", unsafe.Offsetof(gc.rank), unsafe.Sizeof(gc.rank)),
			f("world_size", unsafe.Offsetof(gc.world_size), unsafe.Sizeof(gc.world_size)),
			f("stage", unsafe.Offsetof(gc.stage), unsafe.Sizeof(gc.stage)),
			f("backend", unsafe.Offsetof(gc.backend), unsafe.Sizeof(gc.backend)),
			f("num_threads", unsafe.Offsetof(gc.num_threads), unsafe.Sizeof(gc.num_threads)),
			f("alignment", unsafe.Offsetof(gc.alignment), unsafe.Sizeof(gc.alignment)),
			f("timeout_ms", unsafe.Offsetof(gc.timeout_ms), unsafe.Sizeof(gc.timeout_ms)),
			f("flags", unsafe.Offsetof(gc.flags), unsafe.Sizeof(gc.flags)),
			f("bind_address", unsafe.Offsetof(gc.bind_address), unsafe.Sizeof(gc.bind_address)),
			f("device_ordinal", unsafe.Offsetof(gc.device_ordinal), unsafe.Sizeof(gc.device_ordinal)),
			f("reserved0", unsafe.Offsetof(gc.reserved0), unsafe.Sizeof(gc.reserved0)),
			f("grad_dtype", unsafe.Offsetof(gc.grad_dtype), unsafe.Sizeof(gc.grad_dtype)),
			f("reduce_dtype", unsafe.Offsetof(gc.reduce_dtype), unsafe.Sizeof(gc.reduce_dtype)),
			f("prefetch_depth", unsafe.Offsetof(gc.prefetch_depth), unsafe.Sizeof(gc.prefetch_depth)),
			f("shard_size", unsafe.Offsetof(gc.shard_size), unsafe.Sizeof(gc.shard_size)),
			f("grad_predivide_factor", unsafe.Offsetof(gc.grad_predivide_factor), unsafe.Sizeof(gc.grad_predivide_factor)),
			f("trace_path", unsafe.Offsetof(gc.trace_path), unsafe.Sizeof(gc.trace_path)),
			f("trace_events", unsafe.Offsetof(gc.trace_events), unsafe.Sizeof(gc.trace_events)),
			f("transport", unsafe.Offsetof(gc.transport), unsafe.Sizeof(gc.transport)),
			f("rendezvous_token", unsafe.Offsetof(gc.rendezvous_token), unsafe.Sizeof(gc.rendezvous_token)),
			f("rendezvous_bind", unsafe.Offsetof(gc.rendezvous_bind), unsafe.Sizeof(gc.rendezvous_bind)),
			f("memory_copy_interval", unsafe.Offsetof(gc.memory_copy_interval), unsafe.Sizeof(gc.memory_copy_interval)),
			f("offload", unsafe.Offsetof(gc.offload), unsafe.Sizeof(gc.offload)),
			f("reserved1", unsafe.Offsetof(gc.reserved1), unsafe.Sizeof(gc.reserved1)),
			f("context", unsafe.Offsetof(gc.context), unsafe.Sizeof(gc.context)),
			f("name", unsafe.Offsetof(gc.name), unsafe.Sizeof(gc.name)),
		}},
		{"sx_param_group_desc_t", unsafe.Sizeof(pg), unsafe.Alignof(pg), []fieldLayout{
			f("struct_size", unsafe.Offsetof(pg.struct_size), unsafe.Sizeof(pg.struct_size)),
			f("optimizer", unsafe.Offsetof(pg.optimizer), unsafe.Sizeof(pg.optimizer)),
			f("nesterov", unsafe.Offsetof(pg.nesterov), unsafe.Sizeof(pg.nesterov)),
			f("maximize", unsafe.Offsetof(pg.maximize), unsafe.Sizeof(pg.maximize)),
			f("amsgrad", unsafe.Offsetof(pg.amsgrad), unsafe.Sizeof(pg.amsgrad)),
			f("lr", unsafe.Offsetof(pg.lr), unsafe.Sizeof(pg.lr)),
			f("weight_decay", unsafe.Offsetof(pg.weight_decay), unsafe.Sizeof(pg.weight_decay)),
			f("beta1", unsafe.Offsetof(pg.beta1), unsafe.Sizeof(pg.beta1)),
			f("beta2", unsafe.Offsetof(pg.beta2), unsafe.Sizeof(pg.beta2)),
			f("eps", unsafe.Offsetof(pg.eps), unsafe.Sizeof(pg.eps)),
			f("momentum", unsafe.Offsetof(pg.momentum), unsafe.Sizeof(pg.momentum)),
			f("dampening", unsafe.Offsetof(pg.dampening), unsafe.Sizeof(pg.dampening)),
			f("centered", unsafe.Offsetof(pg.centered), unsafe.Sizeof(pg.centered)),
			f("decoupled_weight_decay", unsafe.Offsetof(pg.decoupled_weight_decay), unsafe.Sizeof(pg.decoupled_weight_decay)),
			f("lr_decay", unsafe.Offsetof(pg.lr_decay), unsafe.Sizeof(pg.lr_decay)),
			f("initial_accumulator_value", unsafe.Offsetof(pg.initial_accumulator_value), unsafe.Sizeof(pg.initial_accumulator_value)),
			f("alpha", unsafe.Offsetof(pg.alpha), unsafe.Sizeof(pg.alpha)),
			f("momentum_decay", unsafe.Offsetof(pg.momentum_decay), unsafe.Sizeof(pg.momentum_decay)),
			f("ns_a", unsafe.Offsetof(pg.ns_a), unsafe.Sizeof(pg.ns_a)),
			f("ns_b", unsafe.Offsetof(pg.ns_b), unsafe.Sizeof(pg.ns_b)),
			f("ns_c", unsafe.Offsetof(pg.ns_c), unsafe.Sizeof(pg.ns_c)),
			f("ns_steps", unsafe.Offsetof(pg.ns_steps), unsafe.Sizeof(pg.ns_steps)),
			f("adjust_lr", unsafe.Offsetof(pg.adjust_lr), unsafe.Sizeof(pg.adjust_lr)),
			f("beta2_decay", unsafe.Offsetof(pg.beta2_decay), unsafe.Sizeof(pg.beta2_decay)),
			f("eps2", unsafe.Offsetof(pg.eps2), unsafe.Sizeof(pg.eps2)),
			f("d", unsafe.Offsetof(pg.d), unsafe.Sizeof(pg.d)),
			f("beta3", unsafe.Offsetof(pg.beta3), unsafe.Sizeof(pg.beta3)),
			f("t_alpha_beta3", unsafe.Offsetof(pg.t_alpha_beta3), unsafe.Sizeof(pg.t_alpha_beta3)),
			f("state_dtype", unsafe.Offsetof(pg.state_dtype), unsafe.Sizeof(pg.state_dtype)),
			f("bf16_stochastic_round", unsafe.Offsetof(pg.bf16_stochastic_round), unsafe.Sizeof(pg.bf16_stochastic_round)),
		}},
		{"sx_param_desc_t", unsafe.Sizeof(pd), unsafe.Alignof(pd), []fieldLayout{
			f("struct_size", unsafe.Offsetof(pd.struct_size), unsafe.Sizeof(pd.struct_size)),
			f("name", unsafe.Offsetof(pd.name), unsafe.Sizeof(pd.name)),
			f("ndim", unsafe.Offsetof(pd.ndim), unsafe.Sizeof(pd.ndim)),
			f("dtype", unsafe.Offsetof(pd.dtype), unsafe.Sizeof(pd.dtype)),
			f("shape", unsafe.Offsetof(pd.shape), unsafe.Sizeof(pd.shape)),
			f("param_group", unsafe.Offsetof(pd.param_group), unsafe.Sizeof(pd.param_group)),
			f("unit", unsafe.Offsetof(pd.unit), unsafe.Sizeof(pd.unit)),
			f("frozen", unsafe.Offsetof(pd.frozen), unsafe.Sizeof(pd.frozen)),
			f("reserved0", unsafe.Offsetof(pd.reserved0), unsafe.Sizeof(pd.reserved0)),
			f("placement", unsafe.Offsetof(pd.placement), unsafe.Sizeof(pd.placement)),
			f("split_dim", unsafe.Offsetof(pd.split_dim), unsafe.Sizeof(pd.split_dim)),
			f("global_shape", unsafe.Offsetof(pd.global_shape), unsafe.Sizeof(pd.global_shape)),
			f("split_offset", unsafe.Offsetof(pd.split_offset), unsafe.Sizeof(pd.split_offset)),
			f("replica", unsafe.Offsetof(pd.replica), unsafe.Sizeof(pd.replica)),
			f("replicas", unsafe.Offsetof(pd.replicas), unsafe.Sizeof(pd.replicas)),
		}},
		{"sx_view_t", unsafe.Sizeof(v), unsafe.Alignof(v), []fieldLayout{
			f("struct_size", unsafe.Offsetof(v.struct_size), unsafe.Sizeof(v.struct_size)),
			f("data", unsafe.Offsetof(v.data), unsafe.Sizeof(v.data)),
			f("numel", unsafe.Offsetof(v.numel), unsafe.Sizeof(v.numel)),
			f("dtype", unsafe.Offsetof(v.dtype), unsafe.Sizeof(v.dtype)),
			f("device", unsafe.Offsetof(v.device), unsafe.Sizeof(v.device)),
		}},
		{"sx_step_options_t", unsafe.Sizeof(so), unsafe.Alignof(so), []fieldLayout{
			f("struct_size", unsafe.Offsetof(so.struct_size), unsafe.Sizeof(so.struct_size)),
			f("max_grad_norm", unsafe.Offsetof(so.max_grad_norm), unsafe.Sizeof(so.max_grad_norm)),
			f("stream", unsafe.Offsetof(so.stream), unsafe.Sizeof(so.stream)),
			f("keep_grads", unsafe.Offsetof(so.keep_grads), unsafe.Sizeof(so.keep_grads)),
			f("defer_gather", unsafe.Offsetof(so.defer_gather), unsafe.Sizeof(so.defer_gather)),
			f("weighted", unsafe.Offsetof(so.weighted), unsafe.Sizeof(so.weighted)),
			f("reserved0", unsafe.Offsetof(so.reserved0), unsafe.Sizeof(so.reserved0)),
			f("weight", unsafe.Offsetof(so.weight), unsafe.Sizeof(so.weight)),
			f("nonfinite", unsafe.Offsetof(so.nonfinite), unsafe.Sizeof(so.nonfinite)),
			f("reserved1", unsafe.Offsetof(so.reserved1), unsafe.Sizeof(so.reserved1)),
		}},
		{"sx_unit_ready_options_t", unsafe.Sizeof(ur), unsafe.Alignof(ur), []fieldLayout{
			f("struct_size", unsafe.Offsetof(ur.struct_size), unsafe.Sizeof(ur.struct_size)),
			f("accumulate", unsafe.Offsetof(ur.accumulate), unsafe.Sizeof(ur.accumulate)),
			f("reserved0", unsafe.Offsetof(ur.reserved0), unsafe.Sizeof(ur.reserved0)),
			f("stream", unsafe.Offsetof(ur.stream), unsafe.Sizeof(ur.stream)),
		}},
		{"sx_step_result_t", unsafe.Sizeof(sr), unsafe.Alignof(sr), []fieldLayout{
			f("struct_size", unsafe.Offsetof(sr.struct_size), unsafe.Sizeof(sr.struct_size)),
			f("grad_norm", unsafe.Offsetof(sr.grad_norm), unsafe.Sizeof(sr.grad_norm)),
			f("step", unsafe.Offsetof(sr.step), unsafe.Sizeof(sr.step)),
			f("skipped", unsafe.Offsetof(sr.skipped), unsafe.Sizeof(sr.skipped)),
			f("reserved0", unsafe.Offsetof(sr.reserved0), unsafe.Sizeof(sr.reserved0)),
			f("loss_scale", unsafe.Offsetof(sr.loss_scale), unsafe.Sizeof(sr.loss_scale)),
			f("nonfinite", unsafe.Offsetof(sr.nonfinite), unsafe.Sizeof(sr.nonfinite)),
			f("reserved1", unsafe.Offsetof(sr.reserved1), unsafe.Sizeof(sr.reserved1)),
		}},
		{"sx_loss_scaling_t", unsafe.Sizeof(ls), unsafe.Alignof(ls), []fieldLayout{
			f("struct_size", unsafe.Offsetof(ls.struct_size), unsafe.Sizeof(ls.struct_size)),
			f("mode", unsafe.Offsetof(ls.mode), unsafe.Sizeof(ls.mode)),
			f("growth_interval", unsafe.Offsetof(ls.growth_interval), unsafe.Sizeof(ls.growth_interval)),
			f("init_scale", unsafe.Offsetof(ls.init_scale), unsafe.Sizeof(ls.init_scale)),
			f("growth_factor", unsafe.Offsetof(ls.growth_factor), unsafe.Sizeof(ls.growth_factor)),
			f("backoff_factor", unsafe.Offsetof(ls.backoff_factor), unsafe.Sizeof(ls.backoff_factor)),
		}},
		{"sx_memory_stats_t", unsafe.Sizeof(ms), unsafe.Alignof(ms), []fieldLayout{
			f("struct_size", unsafe.Offsetof(ms.struct_size), unsafe.Sizeof(ms.struct_size)),
			f("param_bytes", unsafe.Offsetof(ms.param_bytes), unsafe.Sizeof(ms.param_bytes)),
			f("grad_bytes", unsafe.Offsetof(ms.grad_bytes), unsafe.Sizeof(ms.grad_bytes)),
			f("optimizer_bytes", unsafe.Offsetof(ms.optimizer_bytes), unsafe.Sizeof(ms.optimizer_bytes)),
			f("staging_bytes", unsafe.Offsetof(ms.staging_bytes), unsafe.Sizeof(ms.staging_bytes)),
			f("unsharded_optimizer_bytes", unsafe.Offsetof(ms.unsharded_optimizer_bytes), unsafe.Sizeof(ms.unsharded_optimizer_bytes)),
			f("peak_param_bytes", unsafe.Offsetof(ms.peak_param_bytes), unsafe.Sizeof(ms.peak_param_bytes)),
			f("memory_copy_bytes", unsafe.Offsetof(ms.memory_copy_bytes), unsafe.Sizeof(ms.memory_copy_bytes)),
			f("device_bytes", unsafe.Offsetof(ms.device_bytes), unsafe.Sizeof(ms.device_bytes)),
		}},
		{"sx_param_info_t", unsafe.Sizeof(pi), unsafe.Alignof(pi), []fieldLayout{
			f("struct_size", unsafe.Offsetof(pi.struct_size), unsafe.Sizeof(pi.struct_size)),
			f("name", unsafe.Offsetof(pi.name), unsafe.Sizeof(pi.name)),
			f("ndim", unsafe.Offsetof(pi.ndim), unsafe.Sizeof(pi.ndim)),
			f("dtype", unsafe.Offsetof(pi.dtype), unsafe.Sizeof(pi.dtype)),
			f("shape", unsafe.Offsetof(pi.shape), unsafe.Sizeof(pi.shape)),
			f("numel", unsafe.Offsetof(pi.numel), unsafe.Sizeof(pi.numel)),
			f("param_group", unsafe.Offsetof(pi.param_group), unsafe.Sizeof(pi.param_group)),
			f("unit", unsafe.Offsetof(pi.unit), unsafe.Sizeof(pi.unit)),
			f("trainable", unsafe.Offsetof(pi.trainable), unsafe.Sizeof(pi.trainable)),
			f("reserved0", unsafe.Offsetof(pi.reserved0), unsafe.Sizeof(pi.reserved0)),
			f("offset_in_unit", unsafe.Offsetof(pi.offset_in_unit), unsafe.Sizeof(pi.offset_in_unit)),
			f("shard_begin", unsafe.Offsetof(pi.shard_begin), unsafe.Sizeof(pi.shard_begin)),
			f("shard_end", unsafe.Offsetof(pi.shard_end), unsafe.Sizeof(pi.shard_end)),
		}},
		{"sx_unit_info_t", unsafe.Sizeof(ui), unsafe.Alignof(ui), []fieldLayout{
			f("struct_size", unsafe.Offsetof(ui.struct_size), unsafe.Sizeof(ui.struct_size)),
			f("unit", unsafe.Offsetof(ui.unit), unsafe.Sizeof(ui.unit)),
			f("num_params", unsafe.Offsetof(ui.num_params), unsafe.Sizeof(ui.num_params)),
			f("numel", unsafe.Offsetof(ui.numel), unsafe.Sizeof(ui.numel)),
			f("padded_numel", unsafe.Offsetof(ui.padded_numel), unsafe.Sizeof(ui.padded_numel)),
			f("shard_numel", unsafe.Offsetof(ui.shard_numel), unsafe.Sizeof(ui.shard_numel)),
			f("shard_begin", unsafe.Offsetof(ui.shard_begin), unsafe.Sizeof(ui.shard_begin)),
			f("trainable", unsafe.Offsetof(ui.trainable), unsafe.Sizeof(ui.trainable)),
			f("has_optimizer_state", unsafe.Offsetof(ui.has_optimizer_state), unsafe.Sizeof(ui.has_optimizer_state)),
			f("shard_size", unsafe.Offsetof(ui.shard_size), unsafe.Sizeof(ui.shard_size)),
			f("shard_rank", unsafe.Offsetof(ui.shard_rank), unsafe.Sizeof(ui.shard_rank)),
			f("replicas", unsafe.Offsetof(ui.replicas), unsafe.Sizeof(ui.replicas)),
			f("replica_rank", unsafe.Offsetof(ui.replica_rank), unsafe.Sizeof(ui.replica_rank)),
		}},
		{"sx_save_options_t", unsafe.Sizeof(sv), unsafe.Alignof(sv), []fieldLayout{
			f("struct_size", unsafe.Offsetof(sv.struct_size), unsafe.Sizeof(sv.struct_size)),
			f("path", unsafe.Offsetof(sv.path), unsafe.Sizeof(sv.path)),
			f("user_blob", unsafe.Offsetof(sv.user_blob), unsafe.Sizeof(sv.user_blob)),
			f("user_blob_size", unsafe.Offsetof(sv.user_blob_size), unsafe.Sizeof(sv.user_blob_size)),
			f("keep_last", unsafe.Offsetof(sv.keep_last), unsafe.Sizeof(sv.keep_last)),
			f("synchronous", unsafe.Offsetof(sv.synchronous), unsafe.Sizeof(sv.synchronous)),
			f("callback", unsafe.Offsetof(sv.callback), unsafe.Sizeof(sv.callback)),
			f("callback_user", unsafe.Offsetof(sv.callback_user), unsafe.Sizeof(sv.callback_user)),
		}},
		{"sx_load_options_t", unsafe.Sizeof(lo), unsafe.Alignof(lo), []fieldLayout{
			f("struct_size", unsafe.Offsetof(lo.struct_size), unsafe.Sizeof(lo.struct_size)),
			f("path", unsafe.Offsetof(lo.path), unsafe.Sizeof(lo.path)),
			f("flags", unsafe.Offsetof(lo.flags), unsafe.Sizeof(lo.flags)),
			f("reserved0", unsafe.Offsetof(lo.reserved0), unsafe.Sizeof(lo.reserved0)),
		}},
		{"sx_regroup_options_t", unsafe.Sizeof(ro), unsafe.Alignof(ro), []fieldLayout{
			f("struct_size", unsafe.Offsetof(ro.struct_size), unsafe.Sizeof(ro.struct_size)),
			f("checkpoint", unsafe.Offsetof(ro.checkpoint), unsafe.Sizeof(ro.checkpoint)),
			f("load_flags", unsafe.Offsetof(ro.load_flags), unsafe.Sizeof(ro.load_flags)),
			f("join_window_ms", unsafe.Offsetof(ro.join_window_ms), unsafe.Sizeof(ro.join_window_ms)),
			f("expected_world_size", unsafe.Offsetof(ro.expected_world_size), unsafe.Sizeof(ro.expected_world_size)),
			f("admit", unsafe.Offsetof(ro.admit), unsafe.Sizeof(ro.admit)),
		}},
		{"sx_regroup_result_t", unsafe.Sizeof(rr), unsafe.Alignof(rr), []fieldLayout{
			f("struct_size", unsafe.Offsetof(rr.struct_size), unsafe.Sizeof(rr.struct_size)),
			f("epoch", unsafe.Offsetof(rr.epoch), unsafe.Sizeof(rr.epoch)),
			f("rank", unsafe.Offsetof(rr.rank), unsafe.Sizeof(rr.rank)),
			f("world_size", unsafe.Offsetof(rr.world_size), unsafe.Sizeof(rr.world_size)),
			f("shard_size", unsafe.Offsetof(rr.shard_size), unsafe.Sizeof(rr.shard_size)),
			f("previous_rank", unsafe.Offsetof(rr.previous_rank), unsafe.Sizeof(rr.previous_rank)),
			f("previous_world_size", unsafe.Offsetof(rr.previous_world_size), unsafe.Sizeof(rr.previous_world_size)),
			f("step", unsafe.Offsetof(rr.step), unsafe.Sizeof(rr.step)),
			f("from_memory", unsafe.Offsetof(rr.from_memory), unsafe.Sizeof(rr.from_memory)),
			f("reserved0", unsafe.Offsetof(rr.reserved0), unsafe.Sizeof(rr.reserved0)),
		}},
		{"sx_param_state_t", unsafe.Sizeof(ps), unsafe.Alignof(ps), []fieldLayout{
			f("struct_size", unsafe.Offsetof(ps.struct_size), unsafe.Sizeof(ps.struct_size)),
			f("param", unsafe.Offsetof(ps.param), unsafe.Sizeof(ps.param)),
			f("param_group", unsafe.Offsetof(ps.param_group), unsafe.Sizeof(ps.param_group)),
			f("name", unsafe.Offsetof(ps.name), unsafe.Sizeof(ps.name)),
			f("numel", unsafe.Offsetof(ps.numel), unsafe.Sizeof(ps.numel)),
			f("step", unsafe.Offsetof(ps.step), unsafe.Sizeof(ps.step)),
			f("momentum_steps", unsafe.Offsetof(ps.momentum_steps), unsafe.Sizeof(ps.momentum_steps)),
			f("num_tensors", unsafe.Offsetof(ps.num_tensors), unsafe.Sizeof(ps.num_tensors)),
			f("reserved0", unsafe.Offsetof(ps.reserved0), unsafe.Sizeof(ps.reserved0)),
			f("tensor_names", unsafe.Offsetof(ps.tensor_names), unsafe.Sizeof(ps.tensor_names)),
			f("tensors", unsafe.Offsetof(ps.tensors), unsafe.Sizeof(ps.tensors)),
			f("mu_product", unsafe.Offsetof(ps.mu_product), unsafe.Sizeof(ps.mu_product)),
			f("tensor_numels", unsafe.Offsetof(ps.tensor_numels), unsafe.Sizeof(ps.tensor_numels)),
		}},
		{"sx_optimizer_piece_t", unsafe.Sizeof(op), unsafe.Alignof(op), []fieldLayout{
			f("struct_size", unsafe.Offsetof(op.struct_size), unsafe.Sizeof(op.struct_size)),
			f("param", unsafe.Offsetof(op.param), unsafe.Sizeof(op.param)),
			f("grad", unsafe.Offsetof(op.grad), unsafe.Sizeof(op.grad)),
			f("state", unsafe.Offsetof(op.state), unsafe.Sizeof(op.state)),
			f("n", unsafe.Offsetof(op.n), unsafe.Sizeof(op.n)),
			f("grad_scale", unsafe.Offsetof(op.grad_scale), unsafe.Sizeof(op.grad_scale)),
			f("param_index", unsafe.Offsetof(op.param_index), unsafe.Sizeof(op.param_index)),
			f("param_group", unsafe.Offsetof(op.param_group), unsafe.Sizeof(op.param_group)),
			f("offset", unsafe.Offsetof(op.offset), unsafe.Sizeof(op.offset)),
			f("step", unsafe.Offsetof(op.step), unsafe.Sizeof(op.step)),
			f("hyperparameters", unsafe.Offsetof(op.hyperparameters), unsafe.Sizeof(op.hyperparameters)),
			f("user_data", unsafe.Offsetof(op.user_data), unsafe.Sizeof(op.user_data)),
			f("num_slots", unsafe.Offsetof(op.num_slots), unsafe.Sizeof(op.num_slots)),
			f("num_hyperparameters", unsafe.Offsetof(op.num_hyperparameters), unsafe.Sizeof(op.num_hyperparameters)),
			f("error", unsafe.Offsetof(op.error), unsafe.Sizeof(op.error)),
			f("error_size", unsafe.Offsetof(op.error_size), unsafe.Sizeof(op.error_size)),
		}},
		{"sx_optimizer_hyperparameter_t", unsafe.Sizeof(oh), unsafe.Alignof(oh), []fieldLayout{
			f("name", unsafe.Offsetof(oh.name), unsafe.Sizeof(oh.name)),
			f("default_value", unsafe.Offsetof(oh.default_value), unsafe.Sizeof(oh.default_value)),
			f("min", unsafe.Offsetof(oh.min), unsafe.Sizeof(oh.min)),
			f("max", unsafe.Offsetof(oh.max), unsafe.Sizeof(oh.max)),
		}},
		{"sx_optimizer_desc_t", unsafe.Sizeof(od), unsafe.Alignof(od), []fieldLayout{
			f("struct_size", unsafe.Offsetof(od.struct_size), unsafe.Sizeof(od.struct_size)),
			f("name", unsafe.Offsetof(od.name), unsafe.Sizeof(od.name)),
			f("num_slots", unsafe.Offsetof(od.num_slots), unsafe.Sizeof(od.num_slots)),
			f("slot_names", unsafe.Offsetof(od.slot_names), unsafe.Sizeof(od.slot_names)),
			f("slot_initial_values", unsafe.Offsetof(od.slot_initial_values), unsafe.Sizeof(od.slot_initial_values)),
			f("num_hyperparameters", unsafe.Offsetof(od.num_hyperparameters), unsafe.Sizeof(od.num_hyperparameters)),
			f("hyperparameters", unsafe.Offsetof(od.hyperparameters), unsafe.Sizeof(od.hyperparameters)),
			f("update", unsafe.Offsetof(od.update), unsafe.Sizeof(od.update)),
			f("user_data", unsafe.Offsetof(od.user_data), unsafe.Sizeof(od.user_data)),
			f("flags", unsafe.Offsetof(od.flags), unsafe.Sizeof(od.flags)),
			f("reserved0", unsafe.Offsetof(od.reserved0), unsafe.Sizeof(od.reserved0)),
		}},
		{"sx_context_config_t", unsafe.Sizeof(cc), unsafe.Alignof(cc), []fieldLayout{
			f("struct_size", unsafe.Offsetof(cc.struct_size), unsafe.Sizeof(cc.struct_size)),
			f("rendezvous", unsafe.Offsetof(cc.rendezvous), unsafe.Sizeof(cc.rendezvous)),
			f("rank", unsafe.Offsetof(cc.rank), unsafe.Sizeof(cc.rank)),
			f("world_size", unsafe.Offsetof(cc.world_size), unsafe.Sizeof(cc.world_size)),
			f("backend", unsafe.Offsetof(cc.backend), unsafe.Sizeof(cc.backend)),
			f("num_threads", unsafe.Offsetof(cc.num_threads), unsafe.Sizeof(cc.num_threads)),
			f("timeout_ms", unsafe.Offsetof(cc.timeout_ms), unsafe.Sizeof(cc.timeout_ms)),
			f("transport", unsafe.Offsetof(cc.transport), unsafe.Sizeof(cc.transport)),
			f("bind_address", unsafe.Offsetof(cc.bind_address), unsafe.Sizeof(cc.bind_address)),
			f("rendezvous_token", unsafe.Offsetof(cc.rendezvous_token), unsafe.Sizeof(cc.rendezvous_token)),
			f("rendezvous_bind", unsafe.Offsetof(cc.rendezvous_bind), unsafe.Sizeof(cc.rendezvous_bind)),
			f("device_ordinal", unsafe.Offsetof(cc.device_ordinal), unsafe.Sizeof(cc.device_ordinal)),
			f("reserved0", unsafe.Offsetof(cc.reserved0), unsafe.Sizeof(cc.reserved0)),
			f("memory_budget_bytes", unsafe.Offsetof(cc.memory_budget_bytes), unsafe.Sizeof(cc.memory_budget_bytes)),
		}},
		{"sx_context_stats_t", unsafe.Sizeof(cs), unsafe.Alignof(cs), []fieldLayout{
			f("struct_size", unsafe.Offsetof(cs.struct_size), unsafe.Sizeof(cs.struct_size)),
			f("groups", unsafe.Offsetof(cs.groups), unsafe.Sizeof(cs.groups)),
			f("groups_created", unsafe.Offsetof(cs.groups_created), unsafe.Sizeof(cs.groups_created)),
			f("channels", unsafe.Offsetof(cs.channels), unsafe.Sizeof(cs.channels)),
			f("memory_bytes", unsafe.Offsetof(cs.memory_bytes), unsafe.Sizeof(cs.memory_bytes)),
			f("memory_budget_bytes", unsafe.Offsetof(cs.memory_budget_bytes), unsafe.Sizeof(cs.memory_budget_bytes)),
			f("shared_memory", unsafe.Offsetof(cs.shared_memory), unsafe.Sizeof(cs.shared_memory)),
			f("reserved0", unsafe.Offsetof(cs.reserved0), unsafe.Sizeof(cs.reserved0)),
			f("transport_bytes", unsafe.Offsetof(cs.transport_bytes), unsafe.Sizeof(cs.transport_bytes)),
		}},
		{"sx_hf_export_options_t", unsafe.Sizeof(he), unsafe.Alignof(he), []fieldLayout{
			f("struct_size", unsafe.Offsetof(he.struct_size), unsafe.Sizeof(he.struct_size)),
			f("root", unsafe.Offsetof(he.root), unsafe.Sizeof(he.root)),
			f("dtype", unsafe.Offsetof(he.dtype), unsafe.Sizeof(he.dtype)),
			f("max_shard_bytes", unsafe.Offsetof(he.max_shard_bytes), unsafe.Sizeof(he.max_shard_bytes)),
			f("num_names", unsafe.Offsetof(he.num_names), unsafe.Sizeof(he.num_names)),
			f("only_named", unsafe.Offsetof(he.only_named), unsafe.Sizeof(he.only_named)),
			f("sx_names", unsafe.Offsetof(he.sx_names), unsafe.Sizeof(he.sx_names)),
			f("file_names", unsafe.Offsetof(he.file_names), unsafe.Sizeof(he.file_names)),
		}},
		{"sx_peft_config_t", unsafe.Sizeof(pc), unsafe.Alignof(pc), []fieldLayout{
			f("struct_size", unsafe.Offsetof(pc.struct_size), unsafe.Sizeof(pc.struct_size)),
			f("base_model_name_or_path", unsafe.Offsetof(pc.base_model_name_or_path), unsafe.Sizeof(pc.base_model_name_or_path)),
			f("task_type", unsafe.Offsetof(pc.task_type), unsafe.Sizeof(pc.task_type)),
			f("bias", unsafe.Offsetof(pc.bias), unsafe.Sizeof(pc.bias)),
			f("extra_json", unsafe.Offsetof(pc.extra_json), unsafe.Sizeof(pc.extra_json)),
			f("target_modules", unsafe.Offsetof(pc.target_modules), unsafe.Sizeof(pc.target_modules)),
			f("num_target_modules", unsafe.Offsetof(pc.num_target_modules), unsafe.Sizeof(pc.num_target_modules)),
			f("r", unsafe.Offsetof(pc.r), unsafe.Sizeof(pc.r)),
			f("lora_alpha", unsafe.Offsetof(pc.lora_alpha), unsafe.Sizeof(pc.lora_alpha)),
			f("lora_dropout", unsafe.Offsetof(pc.lora_dropout), unsafe.Sizeof(pc.lora_dropout)),
			f("use_rslora", unsafe.Offsetof(pc.use_rslora), unsafe.Sizeof(pc.use_rslora)),
			f("fan_in_fan_out", unsafe.Offsetof(pc.fan_in_fan_out), unsafe.Sizeof(pc.fan_in_fan_out)),
		}},
		{"sx_hf_import_options_t", unsafe.Sizeof(hi), unsafe.Alignof(hi), []fieldLayout{
			f("struct_size", unsafe.Offsetof(hi.struct_size), unsafe.Sizeof(hi.struct_size)),
			f("root", unsafe.Offsetof(hi.root), unsafe.Sizeof(hi.root)),
			f("num_names", unsafe.Offsetof(hi.num_names), unsafe.Sizeof(hi.num_names)),
			f("only_named", unsafe.Offsetof(hi.only_named), unsafe.Sizeof(hi.only_named)),
			f("allow_missing", unsafe.Offsetof(hi.allow_missing), unsafe.Sizeof(hi.allow_missing)),
			f("allow_unexpected", unsafe.Offsetof(hi.allow_unexpected), unsafe.Sizeof(hi.allow_unexpected)),
			f("reserved0", unsafe.Offsetof(hi.reserved0), unsafe.Sizeof(hi.reserved0)),
			f("sx_names", unsafe.Offsetof(hi.sx_names), unsafe.Sizeof(hi.sx_names)),
			f("file_names", unsafe.Offsetof(hi.file_names), unsafe.Sizeof(hi.file_names)),
		}},
		{"sx_hf_import_report_t", unsafe.Sizeof(hr), unsafe.Alignof(hr), []fieldLayout{
			f("struct_size", unsafe.Offsetof(hr.struct_size), unsafe.Sizeof(hr.struct_size)),
			f("num_loaded", unsafe.Offsetof(hr.num_loaded), unsafe.Sizeof(hr.num_loaded)),
			f("num_missing", unsafe.Offsetof(hr.num_missing), unsafe.Sizeof(hr.num_missing)),
			f("num_unexpected", unsafe.Offsetof(hr.num_unexpected), unsafe.Sizeof(hr.num_unexpected)),
			f("reserved0", unsafe.Offsetof(hr.reserved0), unsafe.Sizeof(hr.reserved0)),
			f("missing", unsafe.Offsetof(hr.missing), unsafe.Sizeof(hr.missing)),
			f("missing_keys", unsafe.Offsetof(hr.missing_keys), unsafe.Sizeof(hr.missing_keys)),
			f("unexpected", unsafe.Offsetof(hr.unexpected), unsafe.Sizeof(hr.unexpected)),
		}},
	}
}
