package sx

/*
#include <stdlib.h>
#include "sx/sx.h"
*/
import "C"

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// ContextConfig says how the ranks of a context meet and what its groups share. The
// fields are GroupConfig's of the same names, with the same defaults (zero fields take
// sx's).
type ContextConfig struct {
	Rendezvous      string // required: "local://NAME", "tcp://HOST:PORT", "file:///DIR" or "env://"
	Rank            int32
	WorldSize       int32   // 0: rank and world size from the environment (env://)
	Backend         Backend // of every group in the context
	NumThreads      int32   // the pool the groups share; 0 = the cores divided by the ranks in this process
	TimeoutMs       int32   // the context's creation and its groups' collectives; 0 = 300000
	Transport       Transport
	BindAddress     string
	RendezvousToken Secret
	RendezvousBind  string
	DeviceOrdinal   int32
	// MemoryBudgetBytes is the most its groups may hold on this rank (MemoryStats' param,
	// grad, optimizer, staging and memory-copy bytes, summed over them); 0 = no budget. A
	// Finalize that would exceed it fails with ErrOutOfMemory before anything is allocated.
	MemoryBudgetBytes uint64
}

// ContextStats is what a context holds on this rank now.
type ContextStats struct {
	Groups            int64  // groups of the context alive on this rank
	GroupsCreated     int64  // groups made in it since its creation
	Channels          int64  // channels open on its transport (a group has 1 or more)
	MemoryBytes       uint64 // what its groups hold on this rank, as the budget counts
	MemoryBudgetBytes uint64 // the budget (0 = none)
	SharedMemory      bool   // its channels share memory: every rank on this host, or within each of several hosts of as many ranks
	// TransportBytes is what its Gloo channels keep on this rank between their calls
	// (blocks their calls reuse, and what calls that ended early left), beside MemoryBytes.
	TransportBytes uint64
}

// Context is this rank's handle of a context: what the groups made in it on the same ranks
// share (the rendezvous, the transport and the thread pool), as a fine-tune service runs
// many tenants' jobs on the same ranks. Make a group in it with GroupConfig.Context and
// GroupConfig.Name; each keeps its failures, checkpoints and memory to itself.
//
// Lifetime: the context lives while any group made in it does. Close (or the finalizer,
// for a forgotten one) releases this handle only: the groups already made go on, and the
// context closes with the last of them; no new group can be made in it. Stats may be
// called from any goroutine, and groups may be made in it from several at once.
type Context struct {
	mu sync.RWMutex // Close against the calls in flight
	c  *C.sx_context_t
}

// NewContext creates this rank's handle and connects to the other ranks (collective: it
// blocks until every rank has joined or the timeout passes).
func NewContext(cfg ContextConfig) (*Context, error) {
	if err := CheckVersion(); err != nil {
		return nil, err
	}
	for _, s := range [][2]string{{"Rendezvous", cfg.Rendezvous}, {"BindAddress", cfg.BindAddress},
		{"RendezvousBind", cfg.RendezvousBind}} {
		if err := noNUL(s[0], s[1]); err != nil {
			return nil, err
		}
	}
	var c C.sx_context_config_t
	C.sx_context_config_init(&c, C.size_t(unsafe.Sizeof(c)))
	rdv := C.CString(cfg.Rendezvous)
	defer C.free(unsafe.Pointer(rdv))
	c.rendezvous = rdv
	c.rank = C.int32_t(cfg.Rank)
	c.world_size = C.int32_t(cfg.WorldSize)
	c.backend = C.int32_t(cfg.Backend)
	c.num_threads = C.int32_t(cfg.NumThreads)
	c.timeout_ms = C.int32_t(cfg.TimeoutMs)
	c.transport = C.int32_t(cfg.Transport)
	c.device_ordinal = C.int32_t(cfg.DeviceOrdinal)
	c.memory_budget_bytes = C.uint64_t(cfg.MemoryBudgetBytes)
	if cfg.BindAddress != "" {
		bind := C.CString(cfg.BindAddress)
		defer C.free(unsafe.Pointer(bind))
		c.bind_address = bind
	}
	if cfg.RendezvousToken != "" {
		if strings.IndexByte(string(cfg.RendezvousToken), 0) >= 0 {
			return nil, &Error{Status: ErrInvalidArgument, Message: "RendezvousToken contains a NUL byte"}
		}
		token := C.CString(string(cfg.RendezvousToken))
		defer C.free(unsafe.Pointer(token))
		c.rendezvous_token = token
	}
	if cfg.RendezvousBind != "" {
		rbind := C.CString(cfg.RendezvousBind)
		defer C.free(unsafe.Pointer(rbind))
		c.rendezvous_bind = rbind
	}
	var raw *C.sx_context_t
	if err := call(func() C.sx_status_t { return C.sx_create_context(&c, &raw) }); err != nil {
		return nil, err
	}
	ctx := &Context{c: raw}
	runtime.SetFinalizer(ctx, func(ctx *Context) {
		C.sx_destroy_context(ctx.c)
		atomic.AddInt64(&contextsFinalized, 1)
	})
	return ctx, nil
}

// contextsFinalized counts the contexts released by the finalizer (for the tests).
var contextsFinalized int64

// Close releases this handle. The groups made in the context go on; no new group can be
// made in it. Calling it again does nothing.
func (ctx *Context) Close() error {
	ctx.mu.Lock()
	defer ctx.mu.Unlock()
	if ctx.c == nil {
		return nil
	}
	runtime.SetFinalizer(ctx, nil)
	raw := ctx.c
	ctx.c = nil
	return call(func() C.sx_status_t { return C.sx_destroy_context(raw) })
}

// Stats says what the context holds on this rank now.
func (ctx *Context) Stats() (ContextStats, error) {
	defer runtime.KeepAlive(ctx)
	ctx.mu.RLock()
	defer ctx.mu.RUnlock()
	if ctx.c == nil {
		return ContextStats{}, errorf(ErrInvalidHandle, "the context is closed")
	}
	var s C.sx_context_stats_t
	C.sx_context_stats_init(&s, C.size_t(unsafe.Sizeof(s)))
	if err := call(func() C.sx_status_t { return C.sx_get_context_stats(ctx.c, &s) }); err != nil {
		return ContextStats{}, err
	}
	return ContextStats{Groups: int64(s.groups), GroupsCreated: int64(s.groups_created), Channels: int64(s.channels),
		MemoryBytes: uint64(s.memory_bytes), MemoryBudgetBytes: uint64(s.memory_budget_bytes),
		SharedMemory: s.shared_memory != 0, TransportBytes: uint64(s.transport_bytes)}, nil
}

// handle runs f with the raw handle, held against Close meanwhile; ErrInvalidHandle once
// the context is closed.
func (ctx *Context) handle(f func(raw *C.sx_context_t) (*C.sx_shard_group_t, error)) (*C.sx_shard_group_t, error) {
	defer runtime.KeepAlive(ctx)
	ctx.mu.RLock()
	defer ctx.mu.RUnlock()
	if ctx.c == nil {
		return nil, errorf(ErrInvalidHandle, "the context is closed")
	}
	return f(ctx.c)
}
