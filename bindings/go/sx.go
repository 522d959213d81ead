// Package sx binds libsx, a training runtime with ZeRO-sharded optimizer state, flat
// parameter and gradient buffers and fused optimizer steps, through its C ABI
// (include/sx/sx.h).
//
// The build finds the header and the library through pkg-config (`#cgo pkg-config: sx`):
// PKG_CONFIG_PATH names a build tree (its sx.pc is for use in place) or an install's
// lib/pkgconfig (which the default search path holds for /usr/local and /usr). Both
// sx.pc files carry an rpath to the library, so that a program runs without
// LD_LIBRARY_PATH. README.md's "A first program" is a whole module that uses the package.
//
// A ShardGroup is used by one goroutine at a time. sx reports a failed call's message
// through thread-local state, so every call here runs with its goroutine locked to its
// OS thread until the message is read: callers need not call runtime.LockOSThread for
// sx's sake (only for thread-bound code of their own, such as a CUDA context).
package sx

/*
#cgo pkg-config: sx
#include <stdlib.h>
#include "sx/sx.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// Versions this binding was written against.
const (
	VersionMajor  = 1
	VersionMinor  = 6
	VersionPatch  = 0
	VersionNumber = VersionMajor*10000 + VersionMinor*100 + VersionPatch
)

// Status codes (Error.Status).
const (
	OK                 = C.SX_OK
	ErrInvalidArgument = C.SX_ERR_INVALID_ARGUMENT
	ErrInvalidHandle   = C.SX_ERR_INVALID_HANDLE
	ErrInvalidState    = C.SX_ERR_INVALID_STATE
	ErrOutOfMemory     = C.SX_ERR_OUT_OF_MEMORY
	ErrNotFound        = C.SX_ERR_NOT_FOUND
	ErrAlreadyExists   = C.SX_ERR_ALREADY_EXISTS
	ErrUnsupported     = C.SX_ERR_UNSUPPORTED
	ErrTimeout         = C.SX_ERR_TIMEOUT
	ErrComm            = C.SX_ERR_COMM
	ErrGroupFailed     = C.SX_ERR_GROUP_FAILED
	ErrIO              = C.SX_ERR_IO
	ErrCorrupt         = C.SX_ERR_CORRUPT
	ErrVersion         = C.SX_ERR_VERSION
	ErrAborted         = C.SX_ERR_ABORTED
	ErrMismatch        = C.SX_ERR_MISMATCH
	ErrInternal        = C.SX_ERR_INTERNAL
	ErrCancelled       = C.SX_ERR_CANCELLED
	ErrNonFinite       = C.SX_ERR_NONFINITE // the gradients hold inf or NaN (StepOptions.NonFinite = NonFiniteError)
	ErrOptimizer       = C.SX_ERR_OPTIMIZER // a custom optimizer's update reported failure; the step changed nothing
)

// Error is a failed sx call: its status (one of the Err* constants) and the library's
// message saying what was wrong.
type Error struct {
	Status  int32
	Message string
}

func (e *Error) Error() string {
	name := StatusString(e.Status)
	if i := strings.IndexByte(name, ':'); i >= 0 {
		name = name[:i]
	}
	if e.Message == "" {
		return name
	}
	return name + ": " + e.Message
}

// StatusString is the library's static text for a status ("SX_ERR_TIMEOUT: ...").
func StatusString(status int32) string {
	return C.GoString(C.sx_status_string(C.sx_status_t(status)))
}

// call runs one sx call and, if it fails, reads the message on the same OS thread.
func call(f func() C.sx_status_t) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if s := f(); s != C.SX_OK {
		return &Error{Status: int32(s), Message: C.GoString(C.sx_last_error_message())}
	}
	return nil
}

// noNUL refuses a string that C would read only up to its first NUL byte: another name
// or path than the one given.
func noNUL(what, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return errorf(ErrInvalidArgument, "%s %q holds a NUL byte", what, s)
	}
	return nil
}

func errorf(status int32, format string, args ...interface{}) error {
	return &Error{Status: status, Message: fmt.Sprintf(format, args...)}
}

// Version is the loaded runtime's version.
func Version() (major, minor, patch int) {
	v := int(C.sx_version())
	return v / 10000, v / 100 % 100, v % 100
}

func checkRuntimeVersion(major, minor, patch int) error {
	if major != VersionMajor || minor < VersionMinor {
		return errorf(ErrVersion, "the loaded libsx is version %d.%d.%d; this binding needs %d.x with x >= %d",
			major, minor, patch, VersionMajor, VersionMinor)
	}
	return nil
}

var versionOnce struct {
	sync.Once
	err error
}

// CheckVersion reports whether the loaded libsx has this binding's major version and a
// minor version not older than its own. NewShardGroup calls it.
func CheckVersion() error {
	versionOnce.Do(func() { versionOnce.err = checkRuntimeVersion(Version()) })
	return versionOnce.err
}

// ReadUserBlob reads the user blob stored in the checkpoint at path.
func ReadUserBlob(path string) ([]byte, error) {
	if err := noNUL("path", path); err != nil {
		return nil, err
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var size C.uint64_t
	// With capacity 0 the call fails, saying how much is needed, unless the blob is empty.
	err := call(func() C.sx_status_t { return C.sx_read_user_blob(cpath, nil, 0, &size) })
	if err == nil {
		return []byte{}, nil
	}
	if e, ok := err.(*Error); !ok || e.Status != ErrInvalidArgument || size == 0 {
		return nil, err
	}
	buf := C.malloc(C.size_t(size))
	defer C.free(buf)
	var got C.uint64_t
	if err := call(func() C.sx_status_t { return C.sx_read_user_blob(cpath, buf, size, &got) }); err != nil {
		return nil, err
	}
	return C.GoBytes(buf, C.int(got)), nil
}
