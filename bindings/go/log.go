package sx

/*
#include "sx/sx.h"
void sxgo_log_callback(int32_t level, const char *message, void *user);
*/
import "C"

import "sync"

// Log levels.
const (
	LogError = C.SX_LOG_ERROR
	LogWarn  = C.SX_LOG_WARN
	LogInfo  = C.SX_LOG_INFO
	LogDebug = C.SX_LOG_DEBUG
)

var logger struct {
	sync.RWMutex
	fn func(level int32, message string)
}

//export sxgoLog
func sxgoLog(level C.int32_t, message *C.char) {
	logger.RLock()
	fn := logger.fn
	logger.RUnlock()
	if fn != nil {
		fn(int32(level), C.GoString(message))
	}
}

// SetLogCallback sends sx's log messages up to maxLevel (LogError..LogDebug) to fn,
// which may be called from any thread, concurrently. fn nil turns logging off.
func SetLogCallback(fn func(level int32, message string), maxLevel int32) error {
	logger.Lock()
	logger.fn = fn
	logger.Unlock()
	if fn == nil {
		return call(func() C.sx_status_t { return C.sx_set_log_callback(nil, nil, 0) })
	}
	return call(func() C.sx_status_t {
		return C.sx_set_log_callback(C.sx_log_fn(C.sxgo_log_callback), nil, C.int32_t(maxLevel))
	})
}
