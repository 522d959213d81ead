// Exchangeable host memory: one sparse, anonymous file per process (memfd), mapped shared,
// from which come the buffers that ranks on this host read from each other in place (a
// group's flat params and grads, where its ranks are processes of one host). A
// shared-memory communicator hands the file's descriptor to its peers once, at setup;
// each maps it, and a collective then names a buffer by its offset in the file instead of
// copying it into a segment of the communicator's.
//
// The file is as large as the machine's memory but sparse: a page takes memory only once
// touched, and freed ranges are punched out of the file (their memory goes back to the
// system at once, and they read as zeros when handed out again). The memory goes when the
// last process that maps the file exits, however it exits.
//
// fork: the child of a process with an arena keeps the parent's mapping (the parent's
// buffers stay shared with it, as any MAP_SHARED memory does) but never allocates from it
// or punches it; its first exchangeable allocation makes an arena of its own.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sx {
namespace arena {

// An allocation: where its bytes start (`data`), and what to give back to release().
struct Block {
    void *data = nullptr;
    void *owner = nullptr;  // the arena (opaque)
    size_t offset = 0;      // page-aligned start of the reserved range in the file
    size_t reserved = 0;    // bytes reserved (whole pages)
};

// `bytes` zero-filled at `stagger` bytes (< 4096, a multiple of 64) past a page start of
// this process's arena (made on first use); populate: every page faulted in now. False
// where there is no arena (SX_SHARED_ARENA=0, memfd unavailable) or no room in it: the
// caller falls back to private memory. Any thread.
bool allocate(size_t bytes, size_t stagger, bool populate, Block *out);
// Gives a block back (punches its pages out of the file). A block of another process's
// arena (a fork's parent) is left alone. Any thread.
void release(const Block &b);

// This process's arena (made here if need be), if it can have one: its descriptor (owned by
// the arena; a caller that hands it on sends or duplicates it) and size in bytes. Any thread.
// *base (where given): where it is mapped in this process.
bool describe(int *fd, size_t *bytes, char **base = nullptr);

}  // namespace arena
}  // namespace sx
