package sx

/*
#include <stdint.h>
#include <stdlib.h>
#include "sx/sx.h"
void sxgo_future_callback(sx_future_t *future, sx_status_t status, void *user);
void *sxgo_handle_to_user(uintptr_t handle);
*/
import "C"

import (
	"runtime"
	"runtime/cgo"
	"time"
	"unsafe"
)

// SaveOptions of Save.
type SaveOptions struct {
	// The checkpoint directory to create; it must not exist, and its parent must: a
	// missing parent fails Save itself (ErrNotFound, naming it) before anything is written.
	Path string
	// Opaque bytes stored in the manifest (data-loader position, RNG state); at most 64 MiB.
	UserBlob []byte
	// > 0: after this checkpoint commits, keep only the newest KeepLast beside it.
	KeepLast int32
	// Do all the work in the call.
	Synchronous bool
	// Called once when the save completes (nil error on success), on sx's I/O thread:
	// it must return quickly and must not use the group.
	OnComplete func(error)
}

type futureCallback struct {
	fn func(error)
}

//export sxgoFutureDone
func sxgoFutureDone(future *C.sx_future_t, status C.sx_status_t, user C.uintptr_t) {
	h := cgo.Handle(user)
	cb := h.Value().(*futureCallback)
	h.Delete()
	var err error
	if status != C.SX_OK {
		err = &Error{Status: int32(status), Message: C.GoString(C.sx_future_error_message(future))}
	}
	cb.fn(err)
}

// SaveFuture is a save in progress. Close (or the finalizer) waits for it and releases
// it. Poll, Cancel and Progress may be called from any goroutine.
type SaveFuture struct {
	f *C.sx_future_t
}

// Save (collective) saves the group's state at this step boundary. It returns once
// this rank's shard is staged; the files are written and committed in the background.
func (g *ShardGroup) Save(opts SaveOptions) (*SaveFuture, error) {
	if err := noNUL("path", opts.Path); err != nil {
		return nil, err
	}
	var o C.sx_save_options_t
	C.sx_save_options_init(&o, C.size_t(unsafe.Sizeof(o)))
	path := C.CString(opts.Path)
	defer C.free(unsafe.Pointer(path))
	o.path = path
	if len(opts.UserBlob) > 0 {
		// Copied into C memory: o is passed to C and may not point at Go memory.
		blob := C.CBytes(opts.UserBlob)
		defer C.free(blob)
		o.user_blob = blob
		o.user_blob_size = C.uint64_t(len(opts.UserBlob))
	}
	o.keep_last = C.int32_t(opts.KeepLast)
	o.synchronous = cbool(opts.Synchronous)
	var handle cgo.Handle
	if opts.OnComplete != nil {
		handle = cgo.NewHandle(&futureCallback{fn: opts.OnComplete})
		o.callback = C.sx_future_callback(C.sxgo_future_callback)
		o.callback_user = C.sxgo_handle_to_user(C.uintptr_t(handle))
	}
	var raw *C.sx_future_t
	err := g.do(func(r *C.sx_shard_group_t) C.sx_status_t { return C.sx_save_optim_state(r, &o, &raw) })
	if err != nil {
		if handle != 0 {
			handle.Delete()
		}
		return nil, err
	}
	f := &SaveFuture{f: raw}
	runtime.SetFinalizer(f, func(f *SaveFuture) { C.sx_future_destroy(f.f) })
	return f, nil
}

func (f *SaveFuture) outcome(s C.sx_status_t) error {
	if s == C.SX_OK {
		return nil
	}
	return &Error{Status: int32(s), Message: C.GoString(C.sx_future_error_message(f.f))}
}

func (f *SaveFuture) closed() error {
	return errorf(ErrInvalidHandle, "the save future is closed")
}

// Wait blocks until the save completes and returns its error, if any.
func (f *SaveFuture) Wait() error {
	defer runtime.KeepAlive(f)
	if f.f == nil {
		return f.closed()
	}
	return f.outcome(C.sx_future_wait(f.f, -1))
}

// WaitTimeout waits at most d: false if the save is still running.
func (f *SaveFuture) WaitTimeout(d time.Duration) (bool, error) {
	defer runtime.KeepAlive(f)
	if f.f == nil {
		return false, f.closed()
	}
	s := C.sx_future_wait(f.f, C.int64_t(d/time.Millisecond))
	if s == C.SX_ERR_TIMEOUT {
		if done, err := f.Poll(); err != nil || !done {
			return false, err
		}
	}
	return true, f.outcome(s)
}

// WaitStaged blocks until the snapshot has been copied out of the group's memory:
// after that, params may be written through views again without reaching this
// checkpoint.
func (f *SaveFuture) WaitStaged() error {
	defer runtime.KeepAlive(f)
	if f.f == nil {
		return f.closed()
	}
	raw := f.f
	return call(func() C.sx_status_t { return C.sx_future_wait_staged(raw, -1) })
}

// Poll reports whether the save has completed (successfully or not).
func (f *SaveFuture) Poll() (bool, error) {
	defer runtime.KeepAlive(f)
	if f.f == nil {
		return false, f.closed()
	}
	var done C.int32_t
	err := call(func() C.sx_status_t { return C.sx_future_poll(f.f, &done) })
	return done != 0, err
}

// Cancel asks a running save to stop; it then fails with ErrCancelled and commits nothing.
func (f *SaveFuture) Cancel() error {
	defer runtime.KeepAlive(f)
	if f.f == nil {
		return f.closed()
	}
	return call(func() C.sx_status_t { return C.sx_future_cancel(f.f) })
}

// Progress is the bytes of this rank's files written so far, and in all.
func (f *SaveFuture) Progress() (done, total uint64, err error) {
	defer runtime.KeepAlive(f)
	if f.f == nil {
		return 0, 0, f.closed()
	}
	var d, t C.uint64_t
	err = call(func() C.sx_status_t { return C.sx_future_progress(f.f, &d, &t) })
	return uint64(d), uint64(t), err
}

// Close waits for the save if it is still running and releases the future.
func (f *SaveFuture) Close() error {
	if f.f == nil {
		return nil
	}
	runtime.SetFinalizer(f, nil)
	raw := f.f
	f.f = nil
	return call(func() C.sx_status_t { return C.sx_future_destroy(raw) })
}
