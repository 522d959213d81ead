package sx

/*
#include <stdlib.h>
#include "sx/sx.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// NormDomainConfig says how the ranks of a norm domain meet: every rank of a
// model-parallel trainer (tensor-parallel x pipeline x data-parallel ranks). The fields
// are GroupConfig's of the same names, with the same defaults.
type NormDomainConfig struct {
	Rendezvous string // required: "local://NAME", "tcp://HOST:PORT", "file:///DIR" or "env://"
	Rank       int32
	WorldSize  int32 // 0: rank and world size from the environment (env://)
	TimeoutMs  int32 // its creation and its exchanges; 0 = 300000
	Transport  Transport
}

// NormDomain is this rank's handle of a norm domain (docs/model-parallel.md): the groups
// of every model-parallel slice joined (ShardGroup.JoinNormDomain), so that each step's
// gradient norm, non-finite check and loss-scale decision are taken over all of them.
//
// Lifetime: the groups joined keep the domain alive; Close (or the finalizer) releases
// this handle only. One goroutine uses it at a time.
type NormDomain struct {
	mu sync.Mutex
	d  *C.sx_norm_domain_t
}

// NewNormDomain creates this rank's handle and connects to the domain's other ranks
// (collective: it blocks until every rank has joined or the timeout passes).
func NewNormDomain(cfg NormDomainConfig) (*NormDomain, error) {
	if err := CheckVersion(); err != nil {
		return nil, err
	}
	if err := noNUL("Rendezvous", cfg.Rendezvous); err != nil {
		return nil, err
	}
	var c C.sx_group_config_t
	C.sx_group_config_init(&c, C.size_t(unsafe.Sizeof(c)))
	rdv := C.CString(cfg.Rendezvous)
	defer C.free(unsafe.Pointer(rdv))
	c.rendezvous = rdv
	c.rank = C.int32_t(cfg.Rank)
	c.world_size = C.int32_t(cfg.WorldSize)
	c.timeout_ms = C.int32_t(cfg.TimeoutMs)
	c.transport = C.int32_t(cfg.Transport)
	var raw *C.sx_norm_domain_t
	if err := call(func() C.sx_status_t { return C.sx_create_norm_domain(&c, &raw) }); err != nil {
		return nil, err
	}
	d := &NormDomain{d: raw}
	runtime.SetFinalizer(d, func(d *NormDomain) { C.sx_destroy_norm_domain(d.d) })
	return d, nil
}

// Close releases this handle; the groups joined go on. Calling it again does nothing.
func (d *NormDomain) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.d == nil {
		return nil
	}
	runtime.SetFinalizer(d, nil)
	raw := d.d
	d.d = nil
	return call(func() C.sx_status_t { return C.sx_destroy_norm_domain(raw) })
}

// JoinNormDomain joins the group to domain as model-parallel slice `slice` (collective
// over the domain). From then on each Step's gradient norm, non-finite check and
// loss-scale decision are taken over every group of the domain. The group keeps the
// domain alive.
func (g *ShardGroup) JoinNormDomain(domain *NormDomain, slice int32) error {
	defer runtime.KeepAlive(domain)
	domain.mu.Lock()
	defer domain.mu.Unlock()
	if domain.d == nil {
		return errorf(ErrInvalidHandle, "the norm domain is closed")
	}
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
		return C.sx_join_norm_domain(raw, domain.d, C.int32_t(slice))
	})
}
