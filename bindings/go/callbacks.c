/* C side of the callbacks: sx calls these plain functions, which hand the call to the
 * Go functions exported in future.go, log.go, state.go and optimizer.go. `user` (a custom
 * optimizer's user_data) carries a runtime/cgo.Handle number (future, param state and
 * optimizer callbacks) or nothing (the log callback), never a Go pointer. */
#include <stdint.h>

#include "sx/sx.h"
#include "_cgo_export.h"

void sxgo_future_callback(sx_future_t *future, sx_status_t status, void *user) {
    sxgoFutureDone(future, status, (uintptr_t)user);
}

void sxgo_log_callback(int32_t level, const char *message, void *user) {
    (void)user;
    sxgoLog(level, (char *)message);
}

sx_status_t sxgo_param_state(sx_param_state_t *state, void *user) {
    return sxgoParamState(state, (uintptr_t)user);
}

/* Called on sx's worker threads, concurrently: cgo runs the Go function on each of them. */
int32_t sxgo_optimizer_update(const sx_optimizer_piece_t *piece) {
    return sxgoOptimizerUpdate((sx_optimizer_piece_t *)piece, (uintptr_t)piece->user_data);
}

void *sxgo_handle_to_user(uintptr_t handle) {
    return (void *)handle;
}
