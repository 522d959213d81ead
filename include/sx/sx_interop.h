/*
 * sx_interop.h: Hugging Face checkpoints and PEFT adapters in and out of a live group (1.7).
 *
 * Part of sx's public C API. Include <sx/sx.h>, which includes every topic header; the
 * conventions stated at the top of sx.h hold for every function here.
 */
#ifndef SX_SX_INTEROP_H
#define SX_SX_INTEROP_H

#include "sx_group.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------
 * Hugging Face checkpoints and PEFT adapters (docs/interop.md)
 *
 * A group's params written as the files transformers' and peft's save_pretrained write,
 * and such files read back into its params, at any world size and stage:
 *
 *  - a model: safetensors files, one model.safetensors where the tensors fit in
 *    max_shard_bytes, else model-0000K-of-0000N.safetensors and
 *    model.safetensors.index.json, in fp32, bf16 or fp16 (transformers'
 *    from_pretrained loads them; every header carries {"format": "pt"});
 *  - a PEFT adapter: adapter_model.safetensors and adapter_config.json (peft's
 *    PeftModel.from_pretrained loads it onto its base model).
 *
 * Values: what a checkpoint stores, the fp32 master weights of 16-bit params and the
 * params themselves otherwise. An export converts them to the file's dtype, 16-bit
 * rounded to nearest even (so a bf16 export of bf16 params gives the params' own bits);
 * an import widens the file's F16 and BF16 exactly, sets the masters, and the params
 * take them (16-bit params rounded to nearest even) on every rank. The optimizer state
 * and the step counts stay as they are.
 *
 * Names: a name map of (sx name -> key) pairs, two arrays of num_names strings, takes
 * each named param to its key in the files (torch.distributed.checkpoint's LoadPlanner
 * remapping). A param the map does not name keeps its own name as its key, or, with
 * only_named, takes no part. A map naming a param the group lacks, a param twice, or two
 * params under one key is refused (SX_ERR_INVALID_ARGUMENT, naming them).
 *
 * Every call here is collective: every rank calls it with the same path and the same
 * options' root (NULL options: root 0), else SX_ERR_MISMATCH on every rank. Only the root
 * reads the other arguments and touches the files, so the other ranks need not reach
 * them (they may pass NULL names and config).
 * The root holds one param's whole values at a time besides its shard. A failure anywhere
 * fails the call on every rank with the root's words; nothing else fails the group but a
 * failed collective.
 * ------------------------------------------------------------------------------- */

typedef struct sx_hf_export_options {
    size_t struct_size;
    int32_t root;          /* the rank that writes the files (0: rank 0) */
    int32_t dtype;         /* of the files' tensors: SX_DTYPE_F32 (0: fp32), SX_DTYPE_BF16 or SX_DTYPE_F16 */
    /* sx_export_hf: each file holds at most this many bytes of tensors (0: 5000000000,
     * transformers' "5GB"); a tensor larger than it has a file of its own. Not used by
     * sx_export_peft (one file). */
    uint64_t max_shard_bytes;
    int32_t num_names;     /* pairs in sx_names and file_names (0: none) */
    /* 1: only the params the map names are written (sx_export_peft always takes only
     * those); 0: every param, named ones under their key. */
    int32_t only_named;
    const char *const *sx_names;   /* num_names param names of the group; borrowed for the call */
    const char *const *file_names; /* num_names keys, in order; borrowed for the call */
} sx_hf_export_options_t;

SX_API sx_status_t sx_hf_export_options_init(sx_hf_export_options_t *options, size_t size);

/* Collective. Writes the params (all, or those the map names with only_named) into the
 * new directory `dir` (borrowed; root's is used, and every rank's must be the same text)
 * as a Hugging Face checkpoint: see above. The files are written into a temporary
 * directory beside `dir` (dir.sx-partial-PID), each fsynced, and renamed into place, the
 * parent fsynced: a failure at any point leaves nothing under `dir`. Errors: `dir`
 * exists (SX_ERR_ALREADY_EXISTS) or its parent does not (SX_ERR_NOT_FOUND); a bad option
 * or name map (SX_ERR_INVALID_ARGUMENT, naming it); the file operations' (SX_ERR_IO);
 * a group not finalized (SX_ERR_INVALID_STATE). Thread safety: the group's (one thread at
 * a time). */
SX_API sx_status_t sx_export_hf(sx_shard_group_t *group, const char *dir, const sx_hf_export_options_t *options);

/* adapter_config.json, as peft's LoraConfig writes it: the caller says what the adapter
 * is; sx writes these fields and the params the map names, and nothing it was not told. */
typedef struct sx_peft_config {
    size_t struct_size;
    /* the base model's hub name or directory (NULL: null, as peft writes for a base
     * model built from a config) */
    const char *base_model_name_or_path;
    const char *task_type;   /* "CAUSAL_LM", "SEQ_CLS", ... (NULL: null, peft's default) */
    const char *bias;        /* "none" (NULL), "all" or "lora_only" */
    /* NULL or the text of a JSON object whose members are added to the config as they
     * are (modules_to_save, layers_to_transform, rank_pattern, ...); a member that
     * repeats one sx writes is refused. */
    const char *extra_json;
    const char *const *target_modules; /* num_target_modules module names (at least one); borrowed */
    int32_t num_target_modules;
    int32_t r;               /* the LoRA rank (0: 8, peft's default) */
    double lora_alpha;       /* (0: 8, peft's default) */
    double lora_dropout;     /* in [0, 1) (0: none) */
    int32_t use_rslora;      /* 1: scaling lora_alpha / sqrt(r) instead of lora_alpha / r */
    int32_t fan_in_fan_out;  /* 1: the base layers store their weights transposed (GPT-2's Conv1D) */
} sx_peft_config_t;

SX_API sx_status_t sx_peft_config_init(sx_peft_config_t *config, size_t size);

/* Collective. Writes a PEFT adapter into the new directory `dir`: the params the
 * options' map names (at least one; only_named is implied and max_shard_bytes unused),
 * under their keys (peft's, e.g. "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
 * without the adapter's name), into adapter_model.safetensors, and `config` into
 * adapter_config.json (peft_type "LORA", inference_mode true). Atomic as sx_export_hf.
 * config: borrowed for the call, read on the root only. Errors as sx_export_hf's, and a
 * missing or bad config field (SX_ERR_INVALID_ARGUMENT, naming it). Thread safety: the
 * group's. */
SX_API sx_status_t sx_export_peft(sx_shard_group_t *group, const char *dir, const sx_hf_export_options_t *options,
                                  const sx_peft_config_t *config);

typedef struct sx_hf_import_options {
    size_t struct_size;
    int32_t root;             /* the rank that reads the files (0: rank 0) */
    int32_t num_names;        /* pairs in sx_names and file_names (0: none) */
    /* 1: only the params the map names take part; 0: every param, named ones by their key */
    int32_t only_named;
    int32_t allow_missing;    /* 1: params without a tensor in the files keep their values */
    int32_t allow_unexpected; /* 1: tensors no param takes are left */
    int32_t reserved0;        /* must be 0 */
    const char *const *sx_names;   /* num_names param names of the group; borrowed for the call */
    const char *const *file_names; /* num_names keys, in order; borrowed for the call */
} sx_hf_import_options_t;

SX_API sx_status_t sx_hf_import_options_init(sx_hf_import_options_t *options, size_t size);

/* What an import matched: filled on every rank, by a call that succeeded and by one that
 * failed for its keys (SX_ERR_NOT_FOUND, SX_ERR_INVALID_ARGUMENT); zero where the call
 * failed before it read the keys. */
typedef struct sx_hf_import_report {
    size_t struct_size;
    int32_t num_loaded;       /* params that took values from the files */
    int32_t num_missing;      /* params taking part that have no tensor in the files */
    int32_t num_unexpected;   /* tensors of the files no param took */
    int32_t reserved0;
    /* The names, owned by sx: valid until this thread's next sx_import_hf. */
    const char *const *missing;      /* num_missing params' sx names */
    const char *const *missing_keys; /* the key looked for, for each of them */
    const char *const *unexpected;   /* num_unexpected keys, in the files' order */
} sx_hf_import_report_t;

SX_API sx_status_t sx_hf_import_report_init(sx_hf_import_report_t *report, size_t size);

/* Collective. Reads a Hugging Face checkpoint or a PEFT adapter into the params by name
 * (see above). `path` (borrowed; every rank's must be the same text): a directory holding
 * model.safetensors.index.json (a sharded checkpoint), adapter_model.safetensors or
 * model.safetensors, looked for in that order; or such an index or a .safetensors file
 * itself. Tensors may be F32, F16 or BF16 (others, e.g. an I64 buffer, may lie in the
 * files if no param takes them). Everything is checked on the root before any value
 * moves: every header and the index (SX_ERR_CORRUPT for a damaged or truncated file, or
 * an index naming a file that lacks the key), each param's tensor's shape (must equal
 * the param's) and dtype (SX_ERR_INVALID_ARGUMENT and SX_ERR_UNSUPPORTED, naming the
 * param, key and file), params with no tensor (SX_ERR_NOT_FOUND naming them, unless
 * allow_missing) and tensors no param takes (SX_ERR_INVALID_ARGUMENT naming them, unless
 * allow_unexpected). The values then travel into copies of every rank's shard, which
 * replace it only once every rank has its pieces: a failed import changes no param.
 * report: NULL, or filled (its struct_size set by sx_hf_import_report_init) as said
 * there. Thread safety: the group's. */
SX_API sx_status_t sx_import_hf(sx_shard_group_t *group, const char *path, const sx_hf_import_options_t *options,
                                sx_hf_import_report_t *report);

#ifdef __cplusplus
}
#endif

#endif /* SX_SX_INTEROP_H */
