/*
 * sx_cuda.h: The CUDA backend: where a buffer lives, and what of the backend has run on a
 * device and what has not (docs/versioning.md, "Not yet run on a device").
 *
 * Part of sx's public C API. Include <sx/sx.h>, which includes every topic header; the
 * conventions stated at the top of sx.h hold for every function here.
 */
#ifndef SX_SX_CUDA_H
#define SX_SX_CUDA_H

#include "sx_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- The CUDA backend: what has run on a device, and what has not ------------------
 * SX_BACKEND_CUDA with one rank per group (world_size 1, or shard groups of one: no NCCL)
 * has run on a device (an H200: the optimizers fused, mixed precision with fp32 masters,
 * dynamic loss scaling, stages 1-3, checkpoints moved between device and CPU) and is
 * covered by the rules of docs/versioning.md like the rest of the API.
 * NOT YET RUN ON A DEVICE: SX_BACKEND_CUDA with more than one rank, that is NCCL's
 * collectives between devices (its reduce-scatter, all-gather, the pipeline's channels
 * on NCCL, HSDP meshes on NCCL) and AUTO on a host with several GPUs (each rank needs
 * its own device_ordinal), several ranks on one device (the CPU transports, staged through
 * host memory), and offload = SX_OFFLOAD_STATE (pinned host state, its copies); these are
 * tested on a simulated device (docs/offload.md). It compiles and its tests skip without
 * devices; until a
 * release says it has run, its behaviour may change in a minor release
 * (docs/versioning.md, "Not yet run on a device").
 * ------------------------------------------------------------------------------- */

/* Where a buffer lives (sx_view_t.device). */
#define SX_DEVICE_CPU 0
#define SX_DEVICE_CUDA 1

#ifdef __cplusplus
}
#endif

#endif /* SX_SX_CUDA_H */
