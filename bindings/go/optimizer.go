package sx

/*
#include <stdint.h>
#include <stdlib.h>
#include "sx/sx.h"
int32_t sxgo_optimizer_update(const sx_optimizer_piece_t *piece);
void *sxgo_handle_to_user(uintptr_t handle);
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"sync"
	"unicode/utf8"
	"unsafe"
)

// Limits of custom optimizers.
const (
	MaxCustomSlots           = C.SX_MAX_CUSTOM_SLOTS           // state slots a custom optimizer may keep
	MaxCustomHyperparameters = C.SX_MAX_CUSTOM_HYPERPARAMETERS // hyperparameters of its own (besides sx's)
	MaxCustomOptimizers      = C.SX_MAX_CUSTOM_OPTIMIZERS      // registrations per process
	// OptimizerErrorBytes is the size of the buffer (its NUL included) that carries a
	// failing update's words into Step's ErrOptimizer message.
	OptimizerErrorBytes = C.SX_OPTIMIZER_ERROR_BYTES
)

// OptimizerInPlace is SX_OPTIMIZER_IN_PLACE, the flag OptimizerDesc.InPlace sets.
const OptimizerInPlace = C.SX_OPTIMIZER_IN_PLACE

// UpdatePanicked is the code a custom optimizer's update reports to sx when it panicked
// (the panic is recovered before it reaches C; LastUpdateFailure returns it).
const UpdatePanicked = -1

// OptimizerPiece is one contiguous piece of a param's elements in this rank's shard, as
// sx hands it to a custom optimizer's update. Its slices lend sx's memory for the call
// only: keep none of them.
type OptimizerPiece struct {
	// The n fp32 values (the fp32 masters of 16-bit params), to update in place.
	Param []float32
	// The n reduced gradients, summed over the ranks: use Grad[i] * GradScale. Read only.
	Grad []float32
	// The slots, in registration order, n values each, to update in place.
	State [][]float32
	// The param group's values, in registration order.
	Hyperparameters []float64
	// The average over ranks, the loss scale and the clipping coefficient in one factor.
	GradScale float32
	// The param the elements belong to (its index) and its param group.
	ParamIndex, ParamGroup int32
	// Param[0]'s element offset in the param (row-major).
	Offset uint64
	// The param's step count including this update (1 for its first).
	Step int64
}

// OptimizerHyperparameter is one hyperparameter of a custom optimizer. A name of sx's own
// ("lr", "weight_decay", "beta1", "beta2", "eps", "momentum", ...) is that hyperparameter:
// ParamGroup's field, its HP* key, its range and SetLR. Any other name is the optimizer's
// own, with key CustomHyperparameter(i), i counting its own in order.
type OptimizerHyperparameter struct {
	Name    string
	Default float64 // the value a new param group starts with
	// An inclusive range the value must lie in; both 0: any finite value.
	Min, Max float64
}

// UpdateFailure is an error an update returns to report a failure with a code of its
// own: sx's message names the code. Any other error is reported as 1.
type UpdateFailure int32

func (f UpdateFailure) Error() string {
	return fmt.Sprintf("custom optimizer update failed with %d", int32(f))
}

// OptimizerDesc describes a custom optimizer for RegisterOptimizer.
type OptimizerDesc struct {
	// Unique in the process, 1-63 of [A-Za-z0-9_.-].
	Name string
	// The state slots (at most MaxCustomSlots, distinct names of [A-Za-z0-9_]), which
	// checkpoints and whole-state gathers name their tensors by.
	Slots []string
	// What each slot holds before a param's first update (nil: 0); one per slot.
	SlotInitialValues []float32
	// In the order OptimizerPiece.Hyperparameters holds them.
	Hyperparameters []OptimizerHyperparameter
	// Updates one piece. sx calls it from its own worker threads (not Go's), several
	// pieces at once (pieces never overlap), and it must not call sx. A nil error is
	// success; an error (UpdateFailure for a code of your own) or a panic fails the step
	// on every rank with ErrOptimizer, whose message ends with the error's Error() text
	// (or the panic's value), and then no param or slot has changed (unless InPlace).
	Update func(p *OptimizerPiece) error
	// InPlace registers it SX_OPTIMIZER_IN_PLACE: sx updates the params and slots in
	// place, without the second slot buffers and the copy of the params that let a failed
	// update change nothing (half the update's memory traffic, no extra memory). A failing
	// update then leaves the step half done and fails the group (only Close is left): for
	// an update that cannot fail.
	InPlace bool
}

// customOptimizer is what the update callback reaches through its cgo.Handle.
type customOptimizer struct {
	name                     string
	update                   func(*OptimizerPiece) error
	numSlots, numHyperparams int
	mu                       sync.Mutex
	lastFailure              error
}

func (c *customOptimizer) fail(err error) {
	c.mu.Lock()
	c.lastFailure = err
	c.mu.Unlock()
}

var customOptimizers sync.Map // Optimizer -> *customOptimizer

// writeError puts msg in the piece's error buffer, which sx puts in the step's
// ErrOptimizer message: at most error_size-1 bytes, cut at a UTF-8 character boundary,
// then a NUL. Nothing when the library's piece has no buffer.
func writeError(raw *C.sx_optimizer_piece_t, msg string) {
	if uintptr(raw.struct_size) < unsafe.Sizeof(*raw) || raw.error == nil || raw.error_size == 0 {
		return
	}
	buf := unsafe.Slice((*byte)(unsafe.Pointer(raw.error)), int(raw.error_size))
	n := len(msg)
	if n > len(buf)-1 {
		n = len(buf) - 1
		for n > 0 && !utf8.RuneStart(msg[n]) {
			n--
		}
	}
	copy(buf, msg[:n])
	buf[n] = 0
}

//export sxgoOptimizerUpdate
func sxgoOptimizerUpdate(raw *C.sx_optimizer_piece_t, user C.uintptr_t) (status C.int32_t) {
	c := cgo.Handle(user).Value().(*customOptimizer)
	// Nothing may unwind into C: a panic fails the step, and is kept for LastUpdateFailure.
	// What failed is described in the piece's error buffer, for sx's message.
	defer func() {
		if p := recover(); p != nil {
			c.fail(fmt.Errorf("custom optimizer %q: the update panicked: %v", c.name, p))
			writeError(raw, fmt.Sprintf("the update panicked: %v", p))
			status = UpdatePanicked
		}
	}()
	n := int(raw.n)
	p := OptimizerPiece{
		Param:      unsafe.Slice((*float32)(unsafe.Pointer(raw.param)), n),
		Grad:       unsafe.Slice((*float32)(unsafe.Pointer(raw.grad)), n),
		GradScale:  float32(raw.grad_scale),
		ParamIndex: int32(raw.param_index),
		ParamGroup: int32(raw.param_group),
		Offset:     uint64(raw.offset),
		Step:       int64(raw.step),
	}
	var slots [MaxCustomSlots][]float32
	for k := 0; k < c.numSlots && k < MaxCustomSlots; k++ {
		slots[k] = unsafe.Slice((*float32)(unsafe.Pointer(raw.state[k])), n)
	}
	p.State = slots[:c.numSlots]
	if c.numHyperparams > 0 && raw.hyperparameters != nil {
		p.Hyperparameters = unsafe.Slice((*float64)(unsafe.Pointer(raw.hyperparameters)), c.numHyperparams)
	}
	if err := c.update(&p); err != nil {
		c.fail(err)
		writeError(raw, err.Error())
		if code, ok := err.(UpdateFailure); ok && code != 0 {
			return C.int32_t(code)
		}
		return 1
	}
	return 0
}

// RegisterOptimizer registers a custom optimizer for this process and returns its id, an
// Optimizer to use in NewParamGroup like a built-in one (on every rank, which registers
// the same description first). Registration lasts as long as the process: the Update
// func stays in a cgo.Handle that is never deleted. Each call registers a new handle, so
// registering a name twice is ErrAlreadyExists: ranks that are goroutines of one process
// register once and share the Optimizer. Errors (nothing registered): ErrInvalidArgument
// for a bad or repeated name, too many slots or hyperparameters, a default outside its
// range or a missing Update (sx's message says which); ErrAlreadyExists; more than
// MaxCustomOptimizers registrations.
func RegisterOptimizer(d OptimizerDesc) (Optimizer, error) {
	if err := noNUL("optimizer name", d.Name); err != nil {
		return 0, err
	}
	for _, s := range d.Slots {
		if err := noNUL("slot name", s); err != nil {
			return 0, err
		}
	}
	for _, h := range d.Hyperparameters {
		if err := noNUL("hyperparameter name", h.Name); err != nil {
			return 0, err
		}
	}
	if d.SlotInitialValues != nil && len(d.SlotInitialValues) != len(d.Slots) {
		return 0, errorf(ErrInvalidArgument, "RegisterOptimizer: %d SlotInitialValues for %d slot(s)",
			len(d.SlotInitialValues), len(d.Slots))
	}
	// Everything sx reads is C memory (a Go struct passed to C may not hold Go pointers),
	// freed after the call: sx copies it.
	var frees []unsafe.Pointer
	defer func() {
		for _, p := range frees {
			C.free(p)
		}
	}()
	cstr := func(s string) *C.char {
		p := C.CString(s)
		frees = append(frees, unsafe.Pointer(p))
		return p
	}
	alloc := func(n, size uintptr) unsafe.Pointer {
		p := C.calloc(C.size_t(n+1), C.size_t(size)) // never 0 bytes
		frees = append(frees, p)
		return p
	}
	var desc C.sx_optimizer_desc_t
	C.sx_optimizer_desc_init(&desc, C.size_t(unsafe.Sizeof(desc)))
	desc.name = cstr(d.Name)
	desc.num_slots = C.int32_t(len(d.Slots))
	if len(d.Slots) > 0 {
		names := unsafe.Slice((**C.char)(alloc(uintptr(len(d.Slots)), unsafe.Sizeof((*C.char)(nil)))), len(d.Slots))
		for k, s := range d.Slots {
			names[k] = cstr(s)
		}
		desc.slot_names = &names[0]
	}
	if d.SlotInitialValues != nil && len(d.Slots) > 0 {
		values := unsafe.Slice((*C.float)(alloc(uintptr(len(d.Slots)), unsafe.Sizeof(C.float(0)))), len(d.Slots))
		for k, v := range d.SlotInitialValues {
			values[k] = C.float(v)
		}
		desc.slot_initial_values = &values[0]
	}
	desc.num_hyperparameters = C.int32_t(len(d.Hyperparameters))
	if len(d.Hyperparameters) > 0 {
		var h0 C.sx_optimizer_hyperparameter_t
		hps := unsafe.Slice((*C.sx_optimizer_hyperparameter_t)(alloc(uintptr(len(d.Hyperparameters)), unsafe.Sizeof(h0))),
			len(d.Hyperparameters))
		for k, h := range d.Hyperparameters {
			hps[k].name = cstr(h.Name)
			hps[k].default_value, hps[k].min, hps[k].max = C.double(h.Default), C.double(h.Min), C.double(h.Max)
		}
		desc.hyperparameters = &hps[0]
	}
	c := &customOptimizer{name: d.Name, update: d.Update, numSlots: len(d.Slots), numHyperparams: len(d.Hyperparameters)}
	h := cgo.NewHandle(c)
	if d.Update != nil { // without one, sx refuses the description in its own words
		desc.update = C.sx_optimizer_update_fn(C.sxgo_optimizer_update)
	}
	desc.user_data = C.sxgo_handle_to_user(C.uintptr_t(h))
	if d.InPlace {
		desc.flags = OptimizerInPlace
	}
	var id C.int32_t
	if err := call(func() C.sx_status_t { return C.sx_register_optimizer(&desc, &id) }); err != nil {
		h.Delete() // nothing was registered: sx holds no copy of the handle
		return 0, err
	}
	customOptimizers.Store(Optimizer(id), c)
	return Optimizer(id), nil
}

// IsCustom reports whether o is a custom optimizer this process registered.
func (o Optimizer) IsCustom() bool {
	_, ok := customOptimizers.Load(o)
	return ok
}

// LastUpdateFailure is the error (or recovered panic) a custom optimizer's update last
// reported, nil if none (or o is not a registered custom optimizer). Step's ErrOptimizer
// names the optimizer, the param and the code; this is the update's own words.
func (o Optimizer) LastUpdateFailure() error {
	v, ok := customOptimizers.Load(o)
	if !ok {
		return nil
	}
	c := v.(*customOptimizer)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastFailure
}
