// Fixtures of the bench_sx sections that time steps and checkpoints (step, checkpoint,
// load): groups holding one AdamW param, saves, plain reads of the same files, and the
// page cache dropped between runs. Every failure ends the program (after removing g_root).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sx/sx.h"

namespace sxbench {

// The section's mkdtemp directory, removed by die(); empty when there is none.
extern std::string g_root;

// Prints `what`, removes g_root and exits with 1.
[[noreturn]] void die(const std::string &what);
// Dies naming `what` and sx's error unless s is SX_OK.
void check(sx_status_t s, const char *what);
// Dies naming `what` and errno unless ok.
void check_sys(bool ok, const std::string &what);

// Removes `path` (a tree) and syncs g_root's file system, so that the next timed run
// does not meet the discard of the freed extents.
void remove_tree(const std::string &path);

// A group made from `cfg` (backend CPU) holding one AdamW param "w" of n elements of
// `dtype`, finalized. Collective over cfg's ranks; a failure ends the program.
sx_shard_group_t *make_adamw_group(const sx_group_config_t &cfg, int64_t n, int32_t dtype = SX_DTYPE_F32);

// Rank `rank` of a `world`-rank group (rendezvous `url`, `threads` threads, config flags
// `flags`) holding one AdamW param "w" of n elements of `dtype`, its gradients of
// grad_dtype (0: the param's), values and gradients set; take_step: one step, so that the
// optimizer state exists and is saved. Collective over the world's threads.
sx_shard_group_t *make_group(const std::string &url, int rank, int world, int threads, size_t n, bool take_step,
                             uint32_t flags = 0, int32_t dtype = SX_DTYPE_F32, int32_t grad_dtype = 0);

// Fills a view with values in [-scale, scale], in its dtype (fp32 or 16-bit).
void fill(const sx_view_t &v, float scale);

// Saves g's state into `path`; returns the seconds the call blocked the caller, and in
// *total_s (if not null) the seconds until the save completed, from the call.
double save(sx_shard_group_t *g, const std::string &path, bool synchronous, double *total_s);

// The sizes of the shard files of the checkpoint in dir, in bytes; their paths, sorted,
// into *files when it is not null.
uint64_t shard_bytes(const std::string &dir, std::vector<std::string> *files);

// Reads each file whole, sequentially in 4 MiB pieces, into *buf (one piece, reused).
void plain_read(const std::vector<std::string> &paths, std::vector<char> *buf);

// Drops the file's pages from the page cache (they must be clean: fsynced); returns the
// fraction still resident after, from mincore.
double drop_cache(const std::string &path);

double max_of(const double *v, int n);

// A CPU context of `world` ranks on `rendezvous`, its pool of one thread; timeout_ms 0:
// the default. Null (the error printed) where it could not be made.
sx_context_t *make_context(const std::string &rendezvous, int rank, int world, int32_t timeout_ms = 0);

}  // namespace sxbench
