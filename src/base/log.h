// Logging through the user's callback (sx_set_log_callback); sx never prints, unless the
// environment asks it to: SX_LOG_LEVEL (docs/tracing.md#sx_log_level), read once, sends
// messages up to that level to stderr until a program sets a callback of its own.
#pragma once

#include <string>

#include "sx/sx.h"

namespace sx {

// Replaces the sink: the callback (fn NULL: logging off) and its most verbose level.
// An explicit call wins over SX_LOG_LEVEL.
void set_log_callback(sx_log_fn fn, void *user, int max_level);
bool log_enabled(int level);
void log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// SX_LOG_LEVEL's value: OFF (or NONE), ERROR, WARN (or WARNING), INFO, DEBUG, TRACE (the
// same as DEBUG, sx's most verbose), in any case, or 0-4; spaces around it are ignored.
// *level receives 0 (off) to SX_LOG_DEBUG. False, with *error saying what was wrong and
// what is accepted, for anything else.
bool parse_log_level(const char *text, int *level, std::string *error);

}  // namespace sx
