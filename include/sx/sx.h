/*
 * sx: a training runtime with ZeRO-style sharded optimizer state, flat parameter
 * and gradient buffers, fused optimizer steps and collectives, behind a stable C ABI.
 *
 * Conventions that hold for every function below unless its comment says otherwise:
 *
 *  - Every function returns an sx_status_t. SX_OK is 0; on any other value
 *    sx_last_error_message() (thread-local) says in words what was wrong.
 *  - An invalid call has no effect: arguments and state are checked before anything
 *    changes.
 *  - Pointers passed in are borrowed for the duration of the call and copied if kept.
 *    Pointers handed out (views, names) are owned by the group and stay valid until
 *    the group is destroyed.
 *  - Thread safety: one thread uses a group at a time. Functions marked "any thread"
 *    may be called concurrently with anything.
 *  - Input structs begin with `size_t struct_size`. Fill them with their sx_*_init
 *    function, which sets struct_size and every default. A struct from an older
 *    caller (smaller struct_size) gets the defaults for the fields it lacks; a larger
 *    one is accepted only if its unknown tail is all zero. Output structs also carry
 *    struct_size: the library fills at most struct_size bytes of them.
 *  - Collective functions (marked "collective") must be called by every rank of the
 *    group in the same order with compatible arguments.
 */
#ifndef SX_SX_H
#define SX_SX_H

/* ---------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------- */

#define SX_VERSION_MAJOR 1
#define SX_VERSION_MINOR 6
#define SX_VERSION_PATCH 0
#define SX_VERSION_NUMBER (SX_VERSION_MAJOR * 10000 + SX_VERSION_MINOR * 100 + SX_VERSION_PATCH)

/* The API by topic. Each header is self-contained; this one includes them all, and is
 * the one to include. */
#include "sx_status.h"
#include "sx_group.h"
#include "sx_context.h"
#include "sx_recovery.h"
#include "sx_params.h"
#include "sx_custom_optimizer.h"
#include "sx_step.h"
#include "sx_state.h"
#include "sx_checkpoint.h"
#include "sx_interop.h"
#include "sx_cuda.h"

#endif /* SX_SX_H */
