package sx

/*
#include <stdint.h>
#include <stdlib.h>
#include "sx/sx.h"
sx_status_t sxgo_param_state(sx_param_state_t *state, void *user);
void *sxgo_handle_to_user(uintptr_t handle);
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// ParamState is one param's whole optimizer state (ZeroRedundancyOptimizer's
// consolidated state): its index, name, param group, step counts and tensors by torch's
// names: "exp_avg", "exp_avg_sq" and "max_exp_avg_sq" (Adam and AdamW, the last with
// amsgrad), "momentum_buffer" (SGD with momentum), "master" (the fp32 master weights of
// a 16-bit param); each holds the param's Numel values, in its own (row-major) order,
// but Adafactor's factored moments of a param of shape [..., R, C]: "row_var",
// prod(shape[:-1]) values (torch's shape [..., R, 1]), and "col_var", prod(shape[:-2]) * C
// (torch's [..., 1, C]).
//
// A ParamState handed to a callback of GatherOptimStateFunc or ScatterOptimStateFunc
// lends sx's memory: its Tensors are valid only during that call (copy what you keep).
type ParamState struct {
	Param      int32
	Name       string
	ParamGroup int32
	Numel      uint64
	// Updates applied to the param (torch's state["step"] of Adam and AdamW).
	Step int64
	// SGD with momentum: updates that used momentum_buffer (0: never initialised).
	MomentumSteps int64
	// NAdam: torch's state["mu_product"], the product of the param's momentum
	// coefficients (in (0, 1]); 0 for other optimizers. A scatter may leave it 0: sx
	// then derives it from Step with the group's Beta1 and MomentumDecay.
	MuProduct float64
	Tensors   map[string][]float32
}

// stateCall is what a callback of a gather or a scatter reaches through its handle: the
// Go function, and what it left behind for the caller once sx has returned.
type stateCall struct {
	fn       func(*ParamState) error
	scatter  bool
	err      error
	panicked bool
	panicVal interface{}
}

//export sxgoParamState
func sxgoParamState(raw *C.sx_param_state_t, user C.uintptr_t) (status C.sx_status_t) {
	c := cgo.Handle(user).Value().(*stateCall)
	// Nothing may unwind into C: a panic is kept, ends the call on every rank, and is
	// raised again on the calling goroutine once sx has returned.
	defer func() {
		if p := recover(); p != nil {
			c.panicked, c.panicVal = true, p
			status = C.SX_ERR_CANCELLED
		}
	}()
	st := &ParamState{Param: int32(raw.param), Name: C.GoString(raw.name), ParamGroup: int32(raw.param_group),
		Numel: uint64(raw.numel), Step: int64(raw.step), MomentumSteps: int64(raw.momentum_steps),
		MuProduct: float64(raw.mu_product), Tensors: map[string][]float32{}}
	if n := int(raw.num_tensors); n > 0 && raw.tensor_names != nil && raw.tensors != nil {
		names := unsafe.Slice(raw.tensor_names, n)
		data := unsafe.Slice(raw.tensors, n)
		// Each tensor's own length (Adafactor's row_var and col_var are not the param's
		// numel); numel where sx gives none.
		var numels []C.uint64_t
		if uintptr(raw.struct_size) >= unsafe.Sizeof(*raw) && raw.tensor_numels != nil {
			numels = unsafe.Slice(raw.tensor_numels, n)
		}
		for t := 0; t < n; t++ {
			count := raw.numel
			if numels != nil {
				count = numels[t]
			}
			values := []float32{}
			if count > 0 {
				values = unsafe.Slice((*float32)(unsafe.Pointer(data[t])), int(count))
			}
			st.Tensors[C.GoString(names[t])] = values
		}
	}
	err := c.fn(st)
	if c.scatter {
		raw.step, raw.momentum_steps = C.int64_t(st.Step), C.int64_t(st.MomentumSteps)
		raw.mu_product = C.double(st.MuProduct)
	}
	if err != nil {
		c.err = err
		if e, ok := err.(*Error); ok && e.Status != OK {
			return C.sx_status_t(e.Status)
		}
		return C.SX_ERR_CANCELLED
	}
	return C.SX_OK
}

// wholeState runs a gather or a scatter with fn (nil: none, as on ranks other than the
// root) behind a cgo.Handle. A nil fn on the root fails through a callback, so that
// every rank learns of it (sx alone would refuse it on the root only, before the other
// ranks could know).
func (g *ShardGroup) wholeState(scatter bool, root int32, fn func(*ParamState) error) error {
	if fn == nil {
		if rank, err := g.Rank(); err == nil && rank == root {
			fn = func(*ParamState) error {
				return errorf(ErrInvalidArgument, "no callback or states were given on the root (rank %d)", root)
			}
		}
	}
	c := &stateCall{fn: fn, scatter: scatter}
	var cfn C.sx_param_state_fn
	var user unsafe.Pointer
	if fn != nil {
		h := cgo.NewHandle(c)
		defer h.Delete()
		cfn = C.sx_param_state_fn(C.sxgo_param_state)
		user = C.sxgo_handle_to_user(C.uintptr_t(h))
	}
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
		if scatter {
			return C.sx_scatter_optim_state(raw, C.int32_t(root), cfn, user)
		}
		return C.sx_gather_optim_state(raw, C.int32_t(root), cfn, user)
	})
	if c.panicked {
		panic(c.panicVal)
	}
	if c.err != nil {
		return c.err
	}
	return err
}

// GatherOptimStateFunc (collective: every rank, the same root) gathers every param's
// whole optimizer state onto rank root, where fn sees one param at a time, in index
// order; no rank holds more than its shard, and the root one param's state besides. fn
// runs only on the root (nil is fine elsewhere; on the root it is an error on every
// rank), and its ParamState's tensors are valid only during the call. Every param is
// delivered: one without optimizer state yet (never trainable at a step) has only its
// "master" (16-bit) or no tensor. An error from fn ends the gather on every rank: the
// root returns it, the others an *Error with its status (fn's *Error's own, else
// ErrCancelled). A panic in fn ends it the same way (ErrCancelled elsewhere) and is
// raised again on the root once sx has returned.
func (g *ShardGroup) GatherOptimStateFunc(root int32, fn func(*ParamState) error) error {
	return g.wholeState(false, root, fn)
}

// GatherOptimState (collective) returns every param's whole optimizer state, copied, in
// index order, on rank root, and nil on the other ranks. The root then holds the whole
// unsharded state: GatherOptimStateFunc writes it out param by param instead.
func (g *ShardGroup) GatherOptimState(root int32) ([]ParamState, error) {
	var all []ParamState
	err := g.GatherOptimStateFunc(root, func(st *ParamState) error {
		kept := *st
		kept.Tensors = make(map[string][]float32, len(st.Tensors))
		for name, values := range st.Tensors {
			kept.Tensors[name] = append([]float32{}, values...)
		}
		all = append(all, kept)
		return nil
	})
	if err != nil {
		return nil, err
	}
	rank, err := g.Rank()
	if err != nil || rank != root {
		return nil, err
	}
	return all, nil
}

// ScatterOptimStateFunc (collective: every rank, the same root) is the reverse of a
// gather: on rank root, fn fills each param's whole state (its Tensors, zero on entry,
// to write into, Step and MomentumSteps to set, and NAdam's MuProduct, which may stay 0
// to be derived from Step), in index order, and every rank's shard takes its part, at
// any world size and stage; 16-bit params then take their values from the new masters
// on every rank. A tensor left zero is zero state, as torch's when it has none. fn runs
// only on the root (nil is fine elsewhere, as for a gather). Nothing changes unless
// every rank and every call of fn succeeded; an error or a panic of fn ends the scatter
// as for GatherOptimStateFunc. Slices from State are invalid afterwards.
func (g *ShardGroup) ScatterOptimStateFunc(root int32, fn func(*ParamState) error) error {
	return g.wholeState(true, root, fn)
}

// ScatterOptimState (collective) scatters states, on the root a map from param name to
// state as GatherOptimState returns them (nil on the other ranks; on the root, an error
// on every rank). A param absent from the map gets zero state and step counts; tensors
// its optimizer does not keep are ignored; a tensor of another length is an error, and
// then nothing changes.
func (g *ShardGroup) ScatterOptimState(root int32, states map[string]ParamState) error {
	if states == nil {
		return g.wholeState(true, root, nil)
	}
	return g.wholeState(true, root, func(st *ParamState) error {
		given, ok := states[st.Name]
		if !ok {
			return nil
		}
		for name, values := range given.Tensors {
			if dst, ok := st.Tensors[name]; ok && len(values) != len(dst) {
				return errorf(ErrInvalidArgument, "param '%s': tensor '%s' has %d values; sx keeps %d",
					st.Name, name, len(values), len(dst))
			}
		}
		st.Step, st.MomentumSteps, st.MuProduct = given.Step, given.MomentumSteps, given.MuProduct
		for name, values := range given.Tensors {
			copy(st.Tensors[name], values)
		}
		return nil
	})
}

// StateView is the raw view (fp32) of this rank's part of one of a param's
// optimizer-state tensors ("exp_avg", ..., "master"): the param's elements
// [ShardBegin, ShardEnd) of ParamInfo, empty where this rank holds none of it. Valid
// until Close, Load or ScatterOptimState. Errors: a tensor the param's optimizer does not
// keep (ErrInvalidArgument, listing those it keeps), a param without optimizer state yet
// (ErrInvalidState: its unit gets it once one of its params is trainable).
func (g *ShardGroup) StateView(param int32, tensor string) (View, error) {
	if err := noNUL("tensor", tensor); err != nil {
		return View{}, err
	}
	name := C.CString(tensor)
	defer C.free(unsafe.Pointer(name))
	var v C.sx_view_t
	C.sx_view_init(&v, C.size_t(unsafe.Sizeof(v)))
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
		return C.sx_state_view(raw, C.int32_t(param), name, &v)
	})
	return View{Data: v.data, Numel: uint64(v.numel), Dtype: Dtype(v.dtype), Device: int32(v.device)}, err
}

// State is this rank's part of a param's optimizer-state tensor as a zero-copy slice
// (host memory; see StateView): read it, or write it between steps to seed the state.
// Valid until Close, Load or ScatterOptimState. fp32 state only: a packed slot's view
// (StateView) holds bf16 bits (View.Uint16s) or 8-bit codes (View.Uint8s, with the block
// scales, fp32, as the tensor "<slot>.scale").
func (g *ShardGroup) State(param int32, tensor string) ([]float32, error) {
	v, err := g.StateView(param, tensor)
	if err != nil {
		return nil, err
	}
	s, err := v.Float32s()
	if err != nil {
		return nil, errorf(ErrUnsupported, "the state '%s' of param %d: %s; use StateView", tensor, param,
			err.(*Error).Message)
	}
	return s, nil
}
