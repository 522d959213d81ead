/*
 * sx_status.h: Status codes, errors in words, the runtime's version and logging: what every
 * other part of the API returns and reports through.
 *
 * Part of sx's public C API. Include <sx/sx.h>, which includes every topic header; the
 * conventions stated at the top of sx.h hold for every function here.
 */
#ifndef SX_SX_STATUS_H
#define SX_SX_STATUS_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define SX_API __declspec(dllexport)
#elif defined(__GNUC__)
#define SX_API __attribute__((visibility("default")))
#else
#define SX_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------
 * The runtime's version (the compiled-against version is sx.h's SX_VERSION_*)
 * ------------------------------------------------------------------------------- */

/* The runtime's version as MAJOR*10000 + MINOR*100 + PATCH. Any thread. */
SX_API uint32_t sx_version(void);

/* ---------------------------------------------------------------------------------
 * Status codes: fixed values, never reused.
 * ------------------------------------------------------------------------------- */

typedef int32_t sx_status_t;

#define SX_OK 0
#define SX_ERR_INVALID_ARGUMENT 1 /* an argument is NULL, out of range or malformed */
#define SX_ERR_INVALID_HANDLE 2   /* a handle is NULL, destroyed or not an sx handle */
#define SX_ERR_INVALID_STATE 3    /* the call is not allowed at this point of the group's life */
#define SX_ERR_OUT_OF_MEMORY 4    /* an allocation failed; nothing was changed */
#define SX_ERR_NOT_FOUND 5        /* a named thing does not exist */
#define SX_ERR_ALREADY_EXISTS 6   /* a name is already taken */
#define SX_ERR_UNSUPPORTED 7      /* valid but not supported by this build or backend */
#define SX_ERR_TIMEOUT 8          /* a peer did not answer within the configured timeout */
#define SX_ERR_COMM 9             /* a collective or the rendezvous failed (peer died, socket error) */
#define SX_ERR_GROUP_FAILED 10    /* the group failed earlier; only destroy is allowed */
#define SX_ERR_IO 11              /* a file operation failed */
#define SX_ERR_CORRUPT 12         /* data failed verification */
#define SX_ERR_VERSION 13         /* a format or library version is not supported */
#define SX_ERR_ABORTED 14         /* sx_abort() was called on the group */
#define SX_ERR_MISMATCH 15        /* ranks disagree (param tables, trainable masks, arguments) */
#define SX_ERR_INTERNAL 16        /* a bug in sx; please report it with the message */
#define SX_ERR_CANCELLED 17       /* the operation was cancelled */
#define SX_ERR_NONFINITE 18       /* gradients hold inf or NaN (sx_step with SX_NONFINITE_ERROR) (1.5) */
#define SX_ERR_OPTIMIZER 19       /* a custom optimizer's update reported failure; the step changed nothing (1.6) */

/* Static text naming a status ("SX_ERR_TIMEOUT: ..."). Never NULL. Any thread. */
SX_API const char *sx_status_string(sx_status_t status);

/* The message of the last failed call on this thread, or "" if none. The pointer is
 * valid until the next sx call on this thread. Any thread. */
SX_API const char *sx_last_error_message(void);

/* ---------------------------------------------------------------------------------
 * Logging. The library never prints; it hands messages to this callback.
 * ------------------------------------------------------------------------------- */

#define SX_LOG_ERROR 1
#define SX_LOG_WARN 2
#define SX_LOG_INFO 3
#define SX_LOG_DEBUG 4

/* Called with a level, a NUL-terminated message (borrowed for the call) and `user`.
 * It may be called from any thread, including sx's internal threads, concurrently. */
typedef void (*sx_log_fn)(int32_t level, const char *message, void *user);

/* Sets the process-wide log callback and the most verbose level passed to it
 * (SX_LOG_ERROR..SX_LOG_DEBUG). fn NULL turns logging off (max_level is then ignored).
 * Until a program calls this, the environment variable SX_LOG_LEVEL (OFF, ERROR, WARN,
 * INFO, DEBUG or TRACE in any case, or 0-4; read once) sends messages up to that level to
 * stderr; a call replaces that, whatever its level. A bad SX_LOG_LEVEL is reported at
 * SX_LOG_ERROR to the first sink there is (stderr, or the callback set first).
 * Any thread. */
SX_API sx_status_t sx_set_log_callback(sx_log_fn fn, void *user, int32_t max_level);

#ifdef __cplusplus
}
#endif

#endif /* SX_SX_STATUS_H */
