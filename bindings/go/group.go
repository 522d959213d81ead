package sx

/*
#include <stdlib.h>
#include <string.h>
#include "sx/sx.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"unsafe"
)

// Backend selects where buffers live and which collectives run.
type Backend int32

const (
	// BackendAuto is CUDA where libsx has CUDA and finds a device, else the CPU. Views
	// wrapped as slices need host memory: ask for BackendCPU.
	BackendAuto Backend = C.SX_BACKEND_AUTO
	BackendCPU  Backend = C.SX_BACKEND_CPU
	BackendCUDA Backend = C.SX_BACKEND_CUDA
)

// Transport says how CPU ranks exchange (GroupConfig.Transport). CUDA groups use NCCL
// whatever it says.
type Transport int32

const (
	// TransportAuto exchanges through shared memory where every rank of a communicator
	// runs on this host (processes or threads; the ranks compare their hosts'
	// identities), else through Gloo's TCP. The environment variable SX_SHARED_MEMORY=0
	// has it act as TransportTCP.
	TransportAuto Transport = C.SX_TRANSPORT_AUTO
	// TransportTCP exchanges through Gloo's TCP always.
	TransportTCP Transport = C.SX_TRANSPORT_TCP
)

// Dtype of a param or a view.
type Dtype int32

const (
	DtypeF32  Dtype = C.SX_DTYPE_F32
	DtypeF16  Dtype = C.SX_DTYPE_F16
	DtypeBF16 Dtype = C.SX_DTYPE_BF16
	// DtypeU8: unsigned bytes, the codes of 8-bit optimizer state as StateView shows them
	// (not a param's dtype).
	DtypeU8 Dtype = C.SX_DTYPE_U8
)

func (d Dtype) String() string {
	switch d {
	case DtypeF32:
		return "f32"
	case DtypeF16:
		return "f16"
	case DtypeBF16:
		return "bf16"
	case DtypeU8:
		return "u8"
	}
	return fmt.Sprintf("Dtype(%d)", int32(d))
}

// Where a view's data lives.
const (
	DeviceCPU  = C.SX_DEVICE_CPU
	DeviceCUDA = C.SX_DEVICE_CUDA
)

// Where a CUDA group keeps its fp32 masters and optimizer state: the values that
// GroupConfig.Offload false and true pass.
const (
	OffloadNone  = C.SX_OFFLOAD_NONE  // on its device
	OffloadState = C.SX_OFFLOAD_STATE // in pinned host memory, updated by sx's CPU kernels
)

// GroupFlagNoTrainableAutodetect: trainability changes need RefreshTrainable.
const GroupFlagNoTrainableAutodetect = C.SX_GROUP_NO_TRAINABLE_AUTODETECT

// GroupFlagReserveCheckpointStaging: Finalize reserves the memory the checkpoint saves
// stage this rank's shard in, so that the first save blocks no longer than later ones.
const GroupFlagReserveCheckpointStaging = C.SX_GROUP_RESERVE_CHECKPOINT_STAGING

// GroupFlagJoin: this process joins a running group on the rendezvous (SX_GROUP_JOIN). It
// connects to nobody (Rank and WorldSize are ignored); register the params and param
// groups as the members have them, Finalize, then Regroup waits until the members admit it
// (their PollJoiners, then Regroup with RegroupOptions.Admit).
const GroupFlagJoin = C.SX_GROUP_JOIN

// GroupFlagMemoryCopyWait: with MemoryCopyInterval, a step that takes a copy returns once
// the next rank holds it, so that no step that returned is taken again after a loss.
const GroupFlagMemoryCopyWait = C.SX_GROUP_MEMORY_COPY_WAIT

// GroupFlagOpenMPThreads: in a process that runs an OpenMP runtime of its own, the
// optimizer work of this group's calls runs on the calling thread's OpenMP team instead of
// the group's own pool (docs/threads.md). Without such a runtime loaded, creation fails
// with ErrUnsupported.
const GroupFlagOpenMPThreads = C.SX_GROUP_OPENMP_THREADS

// Limits of param descriptions.
const (
	MaxNdim      = C.SX_MAX_NDIM
	MaxNameBytes = C.SX_MAX_NAME_BYTES
	// The most ranks a group may have (GroupConfig.WorldSize and the launchers' variables).
	MaxWorldSize = C.SX_MAX_WORLD_SIZE
)

// GroupConfig says how ranks meet and what the group is. Zero fields take sx's defaults.
type GroupConfig struct {
	// How ranks find each other. "local://NAME": the ranks are goroutines (threads) of
	// this process, meeting under NAME (any name unique among this process's groups); a
	// single process, world 1 included, uses it. "tcp://HOST:PORT": rank 0 serves a store
	// there. "file:///DIR": a directory every rank can reach. "env://": torchrun's,
	// mpirun's or srun's variables. Required.
	Rendezvous string
	Rank       int32 // this process's rank in [0, WorldSize); ignored when WorldSize is 0
	WorldSize  int32 // number of ranks, at most MaxWorldSize; 0: rank and world size from the environment (env://)
	Stage      int32 // ZeRO stage 1, 2 or 3 (params sharded too: GatherUnit); 0 = 2
	// Where the buffers live: BackendCPU (host memory, what Param and Grad wrap as
	// slices), BackendCUDA, or 0 = BackendAuto, which picks CUDA where libsx was built
	// with CUDA and finds a device, else the CPU. A trainer that computes on the host
	// asks for BackendCPU: on a machine with a GPU, Auto's views are device memory and
	// Param and Grad fail.
	Backend Backend
	// Threads of the group's own pool for the optimizer kernels (a count, >= 0); 0 = the
	// machine's cores divided by the ranks on it (local://), or all of them.
	NumThreads int32
	// Alignment in bytes of the start of every param in the flat buffers: a power of two
	// in [1, 2^20]; 0 = 64. Below a param's element size (1: for every dtype) the params
	// are packed, each starting where the one before ends, so that a unit's flat buffer
	// (UnitView; UnitLayout says whether it is packed) holds them as one block, as a
	// trainer that keeps all its params in one array (llm.c) has them.
	Alignment int32
	// Milliseconds every collective and rendezvous wait may take before it fails
	// (NewShardGroup's phases share one such deadline); 0 = 300000 (5 minutes).
	TimeoutMs int32
	// GroupFlag* bits, or'ed; 0 = none.
	Flags uint32
	// The address the CPU transport binds to and advertises; "" = 127.0.0.1 for local://
	// and a loopback store, for a store on another host the address this host reaches it
	// from, else this host's name.
	BindAddress string
	// The CUDA device (an ordinal, as cudaSetDevice's) for BackendCUDA, and for
	// BackendAuto on a machine with a GPU; 0 = the first device. With several ranks on
	// one host, each its own (torchrun: LOCAL_RANK). The CPU backend ignores it.
	DeviceOrdinal int32
	// Mixed precision. GradDtype DtypeF32: fp32 gradients for every param, whatever its
	// dtype (0: each param's own dtype). ReduceDtype DtypeF32: 16-bit gradients are
	// summed over ranks in fp32 (0: in their own dtype).
	GradDtype   Dtype
	ReduceDtype Dtype
	// Stage 3: how many units sx gathers ahead of GatherUnit calls, in the previous
	// step's order (0: 1; PrefetchNone: none).
	PrefetchDepth int32
	// HSDP: ShardSize ranks (a divisor of WorldSize; 0: all of them) shard the model, and
	// the WorldSize / ShardSize groups of them replicate it. GradPredivideFactor divides
	// 16-bit gradients before their sum (0: FSDP's factor for the shard group).
	ShardSize           int32
	GradPredivideFactor float64
	// The step timeline (docs/tracing.md): TracePath names the Chrome trace-event JSON
	// file this rank writes ("%r" becomes the rank; without one, ".rank<N>" goes before
	// ".json"); "": the SX_TRACE environment variable's, if set. TraceEvents is the most
	// events kept (0: 65536). The file is written by FlushTrace and by Close.
	TracePath   string
	TraceEvents int32
	// Rendezvous security (tcp://, and env:// where rank 0 serves sx's store):
	// RendezvousToken is the secret every rank proves it holds before the store serves
	// it ("": SX_RENDEZVOUS_TOKEN); a wrong or missing one fails NewShardGroup with
	// ErrInvalidArgument. RendezvousBind is where rank 0's server listens ("":
	// SX_RENDEZVOUS_BIND, or the rendezvous host's address; "*": every interface).
	RendezvousToken Secret
	RendezvousBind  string
	// How CPU ranks exchange: TransportAuto (0: shared memory between the ranks of one
	// host, else TCP) or TransportTCP. Every rank passes the same.
	Transport Transport
	// Every MemoryCopyInterval steps each rank keeps a copy of its shard of the state in
	// host memory (a flat group's ranks send theirs to the next rank too), from which
	// Regroup restores the survivors without a checkpoint; 0 = none. Any backend (a CUDA
	// group's copies are in host memory too).
	MemoryCopyInterval int32
	// Offload true (OffloadState): a CUDA group keeps its fp32 masters and optimizer state
	// in pinned host memory, where sx's CPU kernels update them, so that every optimizer
	// runs on it (MemoryStats.DeviceBytes says what stays on the device); false
	// (OffloadNone): on its device. CPU groups ignore it.
	Offload bool
	// Context makes the group in a context (NewContext): it takes the context's
	// rendezvous, ranks, backend, pool, timeout and transport, so Rendezvous, Rank,
	// WorldSize, Backend, NumThreads, TimeoutMs, Transport, BindAddress, RendezvousToken,
	// RendezvousBind and DeviceOrdinal stay zero (or equal the context's). nil: none.
	Context *Context
	// Name is the group's name in its context, the same on every rank; no two live groups
	// of a context share one (ErrInvalidState otherwise). Required with a Context: at most
	// 128 bytes of letters, digits and "-_.". Without one, only with GroupFlagJoin: the
	// context's group (on Rendezvous) that this process joins.
	Name string
}

// Secret is a rendezvous token. Printed with fmt, it shows that it is set, never what
// it is.
type Secret string

func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return "Secret(..)"
}

// GoString keeps %#v from printing it too.
func (s Secret) GoString() string { return s.String() }

// PrefetchNone as GroupConfig.PrefetchDepth: no units are gathered ahead.
const PrefetchNone = C.SX_PREFETCH_NONE

// ShardGroup is this rank's handle of a shard group. Close releases it; a finalizer
// releases a forgotten one. One goroutine uses a group at a time. The slices that
// Param, Grad, State and TrainableMask return, and View.Data, point into the group's
// memory and must not be used after Close (Go cannot check it: keep the group open, and
// reachable, while they are in use).
type ShardGroup struct {
	g *C.sx_shard_group_t
}

// NewShardGroup creates this rank's handle and connects to the other ranks
// (collective: it blocks until every rank has joined or the timeout passes).
func NewShardGroup(cfg GroupConfig) (*ShardGroup, error) {
	if err := CheckVersion(); err != nil {
		return nil, err
	}
	for _, s := range [][2]string{{"Rendezvous", cfg.Rendezvous}, {"BindAddress", cfg.BindAddress},
		{"TracePath", cfg.TracePath}, {"RendezvousBind", cfg.RendezvousBind}, {"Name", cfg.Name}} {
		if err := noNUL(s[0], s[1]); err != nil {
			return nil, err
		}
	}
	var c C.sx_group_config_t
	C.sx_group_config_init(&c, C.size_t(unsafe.Sizeof(c)))
	if cfg.Context == nil || cfg.Rendezvous != "" {
		rdv := C.CString(cfg.Rendezvous)
		defer C.free(unsafe.Pointer(rdv))
		c.rendezvous = rdv
	}
	if cfg.Name != "" {
		name := C.CString(cfg.Name)
		defer C.free(unsafe.Pointer(name))
		c.name = name
	}
	if cfg.BindAddress != "" {
		bind := C.CString(cfg.BindAddress)
		defer C.free(unsafe.Pointer(bind))
		c.bind_address = bind
	}
	c.rank = C.int32_t(cfg.Rank)
	c.world_size = C.int32_t(cfg.WorldSize)
	c.stage = C.int32_t(cfg.Stage)
	c.backend = C.int32_t(cfg.Backend)
	c.num_threads = C.int32_t(cfg.NumThreads)
	c.alignment = C.int32_t(cfg.Alignment)
	c.timeout_ms = C.int32_t(cfg.TimeoutMs)
	c.flags = C.uint32_t(cfg.Flags)
	c.device_ordinal = C.int32_t(cfg.DeviceOrdinal)
	c.grad_dtype = C.int32_t(cfg.GradDtype)
	c.reduce_dtype = C.int32_t(cfg.ReduceDtype)
	c.prefetch_depth = C.int32_t(cfg.PrefetchDepth)
	c.shard_size = C.int32_t(cfg.ShardSize)
	c.grad_predivide_factor = C.double(cfg.GradPredivideFactor)
	if cfg.TracePath != "" {
		trace := C.CString(cfg.TracePath)
		defer C.free(unsafe.Pointer(trace))
		c.trace_path = trace
	}
	c.trace_events = C.int32_t(cfg.TraceEvents)
	c.transport = C.int32_t(cfg.Transport)
	c.memory_copy_interval = C.int32_t(cfg.MemoryCopyInterval)
	c.offload = C.SX_OFFLOAD_NONE
	if cfg.Offload {
		c.offload = C.SX_OFFLOAD_STATE
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
	create := func(context *C.sx_context_t) (*C.sx_shard_group_t, error) {
		c.context = context
		var raw *C.sx_shard_group_t
		err := call(func() C.sx_status_t { return C.sx_create_shard_group(&c, &raw) })
		return raw, err
	}
	var raw *C.sx_shard_group_t
	var err error
	if cfg.Context != nil {
		// The context's handle is borrowed for the call, held against its Close meanwhile.
		raw, err = cfg.Context.handle(create)
	} else {
		raw, err = create(nil)
	}
	if err != nil {
		return nil, err
	}
	g := &ShardGroup{g: raw}
	runtime.SetFinalizer(g, func(g *ShardGroup) {
		C.sx_destroy_shard_group(g.g)
		atomic.AddInt64(&groupsFinalized, 1)
	})
	return g, nil
}

// groupsFinalized counts the groups released by the finalizer (for the tests).
var groupsFinalized int64

// Close releases the group and everything it owns. Calling it again does nothing.
func (g *ShardGroup) Close() error {
	if g.g == nil {
		return nil
	}
	runtime.SetFinalizer(g, nil)
	raw := g.g
	g.g = nil
	return call(func() C.sx_status_t { return C.sx_destroy_shard_group(raw) })
}

// do runs a call on the group, keeping g reachable (and its finalizer away) meanwhile.
func (g *ShardGroup) do(f func(raw *C.sx_shard_group_t) C.sx_status_t) error {
	defer runtime.KeepAlive(g)
	if g.g == nil {
		return errorf(ErrInvalidHandle, "the shard group is closed")
	}
	return call(func() C.sx_status_t { return f(g.g) })
}

func (g *ShardGroup) queryInt(f func(*C.sx_shard_group_t, *C.int32_t) C.sx_status_t) (int32, error) {
	var v C.int32_t
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return f(raw, &v) })
	return int32(v), err
}

// FlushTrace writes this rank's trace file now (replaced atomically) with every event
// the ring holds; nothing without a trace. ErrIO naming the file if it cannot be written.
func (g *ShardGroup) FlushTrace() error {
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_trace_flush(raw) })
}

// Abort makes the group fail: later calls return ErrGroupFailed.
func (g *ShardGroup) Abort() error {
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_abort(raw) })
}

// RegroupOptions says where a regrouped group's state comes from and how long the
// survivors wait for each other.
type RegroupOptions struct {
	// The checkpoint loaded into the new group (resharded) where the memory copies
	// (GroupConfig.MemoryCopyInterval) cannot give its state; Path "": none.
	Checkpoint        LoadOptions
	JoinWindowMs      int32 // how long the survivors wait for each other; 0 = 1000
	ExpectedWorldSize int32 // close once this many arrived; 0 = once every rank arrived or is known lost
	// Joining processes admitted (what PollJoiners returned, on every member); they take
	// the ranks after the members'.
	Admit int32
}

// RegroupResult is what Regroup decided: the new epoch, this rank's place before and
// after, the new mesh's shard size, the step the restored state is at (the trainer
// goes on from the step after it), and whether it came from the memory copies.
type RegroupResult struct {
	Epoch, Rank, WorldSize, ShardSize, PreviousRank, PreviousWorldSize int32
	Step                                                               uint64
	FromMemory                                                         bool
}

// Regroup (collective over the ranks still alive, after a call failed because a peer
// was lost, or after Abort) forms a new group of the survivors at the next epoch on the
// same rendezvous; g becomes it, with its state from the ranks' memory copies where they
// hold every shard, else loaded from opts.Checkpoint. Where it fails, g is still the
// broken group, and the survivors may regroup again (a new epoch). Every view
// taken before is invalid afterwards. The rendezvous store must outlive the lost ranks:
// the sx-rendezvous command ("tcp://HOST:PORT?server=external"), file://, or torchrun's.
func (g *ShardGroup) Regroup(opts RegroupOptions) (RegroupResult, error) {
	if err := noNUL("checkpoint", opts.Checkpoint.Path); err != nil {
		return RegroupResult{}, err
	}
	var o C.sx_regroup_options_t
	C.sx_regroup_options_init(&o, C.size_t(unsafe.Sizeof(o)))
	if opts.Checkpoint.Path != "" {
		path := C.CString(opts.Checkpoint.Path)
		defer C.free(unsafe.Pointer(path))
		o.checkpoint = path
	}
	if opts.Checkpoint.ParamsOnly {
		o.load_flags |= LoadParamsOnly
	}
	if opts.Checkpoint.AllowMissing {
		o.load_flags |= LoadAllowMissing
	}
	if opts.Checkpoint.AllowExtra {
		o.load_flags |= LoadAllowExtra
	}
	o.join_window_ms = C.int32_t(opts.JoinWindowMs)
	o.expected_world_size = C.int32_t(opts.ExpectedWorldSize)
	o.admit = C.int32_t(opts.Admit)
	var r C.sx_regroup_result_t
	C.sx_regroup_result_init(&r, C.size_t(unsafe.Sizeof(r)))
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_regroup(raw, &o, &r) })
	if err != nil {
		return RegroupResult{}, err
	}
	return RegroupResult{Epoch: int32(r.epoch), Rank: int32(r.rank), WorldSize: int32(r.world_size),
		ShardSize: int32(r.shard_size), PreviousRank: int32(r.previous_rank),
		PreviousWorldSize: int32(r.previous_world_size), Step: uint64(r.step), FromMemory: r.from_memory != 0}, nil
}

// PollJoiners (collective) returns how many processes wait to join the group (created
// with GroupFlagJoin on its rendezvous) and were not admitted yet, the same on every rank.
func (g *ShardGroup) PollJoiners() (int32, error) {
	var n C.int32_t
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_poll_joiners(raw, &n) })
	return int32(n), err
}

// LostRanks returns the ranks (ascending) whose process is known to have exited: a peer
// on this host whose process has gone. Peers on other hosts are known only through the
// errors their loss causes. After a failure, ExpectedWorldSize = world size -
// len(LostRanks()) lets Regroup close without waiting for its window. A failed group
// answers too.
func (g *ShardGroup) LostRanks() ([]int32, error) {
	var count C.int32_t
	if err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
		return C.sx_get_lost_ranks(raw, nil, 0, &count)
	}); err != nil {
		return nil, err
	}
	for { // (another may be lost between the two calls: then again, with room for it)
		ranks := make([]C.int32_t, int(count)+1)
		capacity := C.int32_t(len(ranks))
		if err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
			return C.sx_get_lost_ranks(raw, &ranks[0], capacity, &count)
		}); err != nil {
			return nil, err
		}
		if count <= capacity {
			out := make([]int32, int(count))
			for i := range out {
				out[i] = int32(ranks[i])
			}
			return out, nil
		}
	}
}

// Optimizer kind of a param group.
type Optimizer int32

const (
	SGD     Optimizer = C.SX_OPTIM_SGD
	Adam    Optimizer = C.SX_OPTIM_ADAM
	AdamW   Optimizer = C.SX_OPTIM_ADAMW
	Adagrad Optimizer = C.SX_OPTIM_ADAGRAD
	RMSprop Optimizer = C.SX_OPTIM_RMSPROP
	Adamax  Optimizer = C.SX_OPTIM_ADAMAX
	NAdam   Optimizer = C.SX_OPTIM_NADAM
	RAdam   Optimizer = C.SX_OPTIM_RADAM
	Lion    Optimizer = C.SX_OPTIM_LION // Lion (Chen et al. 2023), as the lion-pytorch package's
	// LAMB (You et al. 2020), as the pytorch-optimizer package's Lamb; CPU groups, and
	// CUDA groups with GroupConfig.Offload.
	Lamb Optimizer = C.SX_OPTIM_LAMB
	// Muon, as torch.optim.Muon: 2-D params only (give others a group of another
	// optimizer, AdamW as usual); CPU groups, and CUDA groups with GroupConfig.Offload.
	Muon Optimizer = C.SX_OPTIM_MUON
	// Adafactor, as torch.optim.Adafactor: factored second moments for params of two or
	// more dimensions; CPU groups, and CUDA groups with GroupConfig.Offload.
	Adafactor Optimizer = C.SX_OPTIM_ADAFACTOR
	// AdEMAMix (Pagliardini et al. 2024), as the pytorch-optimizer package's AdEMAMix.
	AdEMAMix Optimizer = C.SX_OPTIM_ADEMAMIX
	// The first id RegisterOptimizer returns: a custom optimizer is an Optimizer too.
	OptimCustomFirst Optimizer = C.SX_OPTIM_CUSTOM_FIRST
)

// ParamGroup is an optimizer and its hyperparameters. Start from NewParamGroup, which
// fills the optimizer's defaults (torch.optim's; lion-pytorch's for Lion;
// pytorch-optimizer's for LAMB). A hyperparameter that does not apply to the optimizer
// must keep its default (or be 0, which means the default), else AddParamGroup fails
// with ErrInvalidArgument.
//
// Precision: sx keeps hyperparameters as the float64 values given, and computes a step's
// scalars from them in float64, as torch does with Python floats (lr / (1 - beta1^t),
// 1 - lr*weight_decay, ...), rounding each to float32 where it meets the fp32 tensors
// (docs/optimizers.md, "Exactness"). A trainer that holds its hyperparameters as
// float32 (llm.c) passes float64(x) of its float32 x, an exact conversion, so that sx
// uses the very value it holds: float32(3e-4) is 3.0000001e-4, not the 3e-4 a literal
// gives, and the scalars derived in float64 from the two may round differently.
type ParamGroup struct {
	Optimizer                     Optimizer
	LR, WeightDecay, Beta1, Beta2 float64
	Eps, Momentum, Dampening      float64
	Nesterov, Maximize, Amsgrad   bool
	// Adagrad.
	LRDecay, InitialAccumulatorValue float64
	// RMSprop: the smoothing constant, and whether to center the second moment.
	Alpha    float64
	Centered bool
	// NAdam.
	MomentumDecay float64
	// NAdam, RAdam, LAMB: AdamW-style (decoupled) weight decay (LAMB's default: on,
	// pytorch-optimizer's weight_decouple).
	DecoupledWeightDecay bool
	// Muon: the Newton-Schulz coefficients (torch's ns_coefficients), the number of
	// Newton-Schulz iterations (1 to 99), and the lr each param is updated with (torch's
	// adjust_lr_fn).
	NSA, NSB, NSC float64
	NSSteps       int32
	AdjustLR      MuonAdjustLR
	// Adafactor: the second moments' decay, (1 - beta2_t) = step^Beta2Decay (<= 0), the
	// floor of a param's RMS in its step size (the second of torch's eps; its first is
	// Eps, torch's None 2^-23), and the update's RMS clip (>= 1).
	Beta2Decay, Eps2, D float64
	// AdEMAMix: the slow moment's decay (in [0, 1); its weight is Alpha) and the steps
	// Alpha and Beta3 warm up over (0: none).
	Beta3, TAlphaBeta3 float64
	// How the group keeps its optimizer state slots (the default: StateDtypeFP32).
	StateDtype StateDtype
	// torchao's bf16_stochastic_round: the group's params, every one bf16, keep no fp32
	// master weights; each update is computed in fp32 and rounded stochastically into
	// them, with random bits that depend on the param, its step and the element only (the
	// same at any world size and stage). Elementwise optimizers, on CPU and CUDA groups;
	// checkpoints and the whole-state calls carry its params as fp32 (widened, and
	// rounded to nearest back); a state view of "master" is the bf16 params; memory
	// copies and Regroup carry them as bf16.
	BF16StochasticRound bool
}

// MuonAdjustLR is Muon's adjust_lr_fn: the lr a param of shape [A, B] is updated with.
type MuonAdjustLR int32

const (
	MuonAdjustLROriginal          MuonAdjustLR = C.SX_MUON_ADJUST_LR_ORIGINAL           // lr * sqrt(max(1, A / B)) (torch's None or "original"; the default)
	MuonAdjustLRMatchRMSAdamW     MuonAdjustLR = C.SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW    // lr * 0.2 * sqrt(max(A, B)) ("match_rms_adamw")
	MuonAdjustLRSpectralUnclamped MuonAdjustLR = C.SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED // lr * sqrt(A / B) ("spectral_unclamped")
)

// StateDtype is how a param group keeps its optimizer state slots. Every update is
// computed in fp32 whatever the slots hold. StateDtypeBF16 and StateDtype8Bit apply to
// the elementwise optimizers (SGD, Adam, AdamW, Adagrad, RMSprop, Adamax, NAdam, RAdam,
// Lion, AdEMAMix); LAMB's, Muon's, Adafactor's and custom optimizers' slots stay fp32.
type StateDtype int32

const (
	StateDtypeFP32 StateDtype = C.SX_STATE_FP32 // fp32 slots (the default)
	StateDtypeBF16 StateDtype = C.SX_STATE_BF16 // bf16 slots, rounded to nearest even after each update
	// 8-bit block-wise slots, torchao's AdamW8bit quantization: blocks of 256 elements,
	// each a scale and 256 codes; a param of fewer than 4096 elements, or not a multiple
	// of 256, keeps fp32 slots.
	StateDtype8Bit StateDtype = C.SX_STATE_8BIT
)

// NewParamGroup returns the optimizer's defaults (torch.optim's; lion-pytorch's for Lion;
// pytorch-optimizer's for LAMB; a custom optimizer's registered ones). A custom
// optimizer's own hyperparameters are set after AddParamGroup, with
// SetHyperparameter(pg, CustomHyperparameter(i), v).
func NewParamGroup(opt Optimizer) ParamGroup {
	var d C.sx_param_group_desc_t
	C.sx_param_group_desc_init(&d, C.size_t(unsafe.Sizeof(d)), C.int32_t(opt))
	return ParamGroup{Optimizer: Optimizer(d.optimizer), LR: float64(d.lr), WeightDecay: float64(d.weight_decay),
		Beta1: float64(d.beta1), Beta2: float64(d.beta2), Eps: float64(d.eps), Momentum: float64(d.momentum),
		Dampening: float64(d.dampening), Nesterov: d.nesterov != 0, Maximize: d.maximize != 0, Amsgrad: d.amsgrad != 0,
		LRDecay: float64(d.lr_decay), InitialAccumulatorValue: float64(d.initial_accumulator_value),
		Alpha: float64(d.alpha), Centered: d.centered != 0, MomentumDecay: float64(d.momentum_decay),
		DecoupledWeightDecay: d.decoupled_weight_decay != 0, NSA: float64(d.ns_a), NSB: float64(d.ns_b),
		NSC: float64(d.ns_c), NSSteps: int32(d.ns_steps), AdjustLR: MuonAdjustLR(d.adjust_lr),
		Beta2Decay: float64(d.beta2_decay), Eps2: float64(d.eps2), D: float64(d.d),
		Beta3: float64(d.beta3), TAlphaBeta3: float64(d.t_alpha_beta3), StateDtype: StateDtype(d.state_dtype),
		BF16StochasticRound: d.bf16_stochastic_round != 0}
}

func cbool(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// AddParamGroup adds a param group and returns its index. Before Finalize, or between
// steps after it (torch's add_param_group): the group and the params added with it then
// wait for the next Finalize, which every rank calls after adding the same.
func (g *ShardGroup) AddParamGroup(p ParamGroup) (int32, error) {
	var d C.sx_param_group_desc_t
	C.sx_param_group_desc_init(&d, C.size_t(unsafe.Sizeof(d)), C.int32_t(p.Optimizer))
	d.optimizer = C.int32_t(p.Optimizer)
	d.lr, d.weight_decay = C.double(p.LR), C.double(p.WeightDecay)
	d.beta1, d.beta2, d.eps = C.double(p.Beta1), C.double(p.Beta2), C.double(p.Eps)
	d.momentum, d.dampening = C.double(p.Momentum), C.double(p.Dampening)
	d.nesterov, d.maximize, d.amsgrad = cbool(p.Nesterov), cbool(p.Maximize), cbool(p.Amsgrad)
	d.lr_decay, d.initial_accumulator_value = C.double(p.LRDecay), C.double(p.InitialAccumulatorValue)
	d.alpha, d.centered = C.double(p.Alpha), cbool(p.Centered)
	d.momentum_decay, d.decoupled_weight_decay = C.double(p.MomentumDecay), cbool(p.DecoupledWeightDecay)
	d.ns_a, d.ns_b, d.ns_c = C.double(p.NSA), C.double(p.NSB), C.double(p.NSC)
	d.ns_steps, d.adjust_lr = C.int32_t(p.NSSteps), C.int32_t(p.AdjustLR)
	d.beta2_decay, d.eps2, d.d = C.double(p.Beta2Decay), C.double(p.Eps2), C.double(p.D)
	d.beta3, d.t_alpha_beta3 = C.double(p.Beta3), C.double(p.TAlphaBeta3)
	d.state_dtype = C.int32_t(p.StateDtype)
	d.bf16_stochastic_round = cbool(p.BF16StochasticRound)
	var index C.int32_t = -1
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_add_param_group(raw, &d, &index) })
	return int32(index), err
}

// Hyperparameter keys.
type Hyperparameter int32

const (
	HPLR          Hyperparameter = C.SX_HP_LR
	HPWeightDecay Hyperparameter = C.SX_HP_WEIGHT_DECAY
	HPBeta1       Hyperparameter = C.SX_HP_BETA1
	HPBeta2       Hyperparameter = C.SX_HP_BETA2
	HPEps         Hyperparameter = C.SX_HP_EPS
	HPMomentum    Hyperparameter = C.SX_HP_MOMENTUM
	HPDampening   Hyperparameter = C.SX_HP_DAMPENING
	HPNesterov    Hyperparameter = C.SX_HP_NESTEROV
	HPMaximize    Hyperparameter = C.SX_HP_MAXIMIZE
	HPAmsgrad     Hyperparameter = C.SX_HP_AMSGRAD
	// Adagrad.
	HPLRDecay                 Hyperparameter = C.SX_HP_LR_DECAY
	HPInitialAccumulatorValue Hyperparameter = C.SX_HP_INITIAL_ACCUMULATOR_VALUE
	// RMSprop: the smoothing constant; centered (0 or 1, only before the first step).
	HPAlpha    Hyperparameter = C.SX_HP_ALPHA
	HPCentered Hyperparameter = C.SX_HP_CENTERED
	// NAdam.
	HPMomentumDecay Hyperparameter = C.SX_HP_MOMENTUM_DECAY
	// NAdam, RAdam, LAMB: 0 or 1 (AdamW-style weight decay; LAMB's default 1).
	HPDecoupledWeightDecay Hyperparameter = C.SX_HP_DECOUPLED_WEIGHT_DECAY
	// Muon: the Newton-Schulz coefficients, iterations (1 to 99), and a MuonAdjustLR.
	HPNSA      Hyperparameter = C.SX_HP_NS_A
	HPNSB      Hyperparameter = C.SX_HP_NS_B
	HPNSC      Hyperparameter = C.SX_HP_NS_C
	HPNSSteps  Hyperparameter = C.SX_HP_NS_STEPS
	HPAdjustLR Hyperparameter = C.SX_HP_ADJUST_LR
	// Adafactor: the second moments' decay (<= 0), the floor of a param's RMS in its step
	// size (the second of torch's eps), and the update's RMS clip (>= 1).
	HPBeta2Decay Hyperparameter = C.SX_HP_BETA2_DECAY
	HPEps2       Hyperparameter = C.SX_HP_EPS2
	HPD          Hyperparameter = C.SX_HP_D
	// AdEMAMix: the slow moment's decay and the steps of its warmup (0: none).
	HPBeta3       Hyperparameter = C.SX_HP_BETA3
	HPTAlphaBeta3 Hyperparameter = C.SX_HP_T_ALPHA_BETA3
	// A StateDtype; only before the first step.
	HPStateDtype Hyperparameter = C.SX_HP_STATE_DTYPE
	// 0 or 1 (ParamGroup.BF16StochasticRound); only before Finalize lays its group out.
	HPBF16StochasticRound Hyperparameter = C.SX_HP_BF16_STOCHASTIC_ROUND
	// A custom optimizer's own hyperparameter i (counting only its own, in registration
	// order) is HPCustom + Hyperparameter(i); see CustomHyperparameter.
	HPCustom Hyperparameter = C.SX_HP_CUSTOM
)

// CustomHyperparameter is the key of a custom optimizer's own hyperparameter i.
func CustomHyperparameter(i int) Hyperparameter { return HPCustom + Hyperparameter(i) }

// SetHyperparameter changes one hyperparameter of a param group from the next step on.
func (g *ShardGroup) SetHyperparameter(paramGroup int32, key Hyperparameter, value float64) error {
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
		return C.sx_set_hyperparameter(raw, C.int32_t(paramGroup), C.int32_t(key), C.double(value))
	})
}

// GetHyperparameter reads one hyperparameter of a param group.
func (g *ShardGroup) GetHyperparameter(paramGroup int32, key Hyperparameter) (float64, error) {
	var v C.double
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
		return C.sx_get_hyperparameter(raw, C.int32_t(paramGroup), C.int32_t(key), &v)
	})
	return float64(v), err
}

// ParamGroupSteps is the steps a param group took since it was added (LAMB's and
// AdEMAMix's bias corrections count them; a skipped step does not).
func (g *ShardGroup) ParamGroupSteps(paramGroup int32) (int64, error) {
	var steps C.int64_t
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
		return C.sx_get_param_group_steps(raw, C.int32_t(paramGroup), &steps)
	})
	return int64(steps), err
}

// SetLR sets a param group's learning rate from the next step on. Like every
// hyperparameter it is a float64 (see ParamGroup on precision: a float32 trainer passes
// float64(lr), the value it holds).
func (g *ShardGroup) SetLR(paramGroup int32, lr float64) error {
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
		return C.sx_set_lr(raw, C.int32_t(paramGroup), C.double(lr))
	})
}

// Param describes a param to register. Dtype 0 means fp32; DtypeF16 and DtypeBF16 params
// (all params of one unit share a dtype) get fp32 master weights and optimizer state.
type Param struct {
	Name       string
	Shape      []int64
	Dtype      Dtype
	ParamGroup int32
	Unit       int32
	Frozen     bool
	// Placement in a model the trainer splits itself (docs/model-parallel.md); the zero
	// value is PlacementWhole. PlacementSplit: the piece [SplitOffset, SplitOffset +
	// Shape[SplitDim]) on dimension SplitDim of a logical tensor of GlobalShape.
	// PlacementReplicated: copy Replica of Replicas identical copies (copy 0 alone
	// counts in a norm domain's gradient norm).
	Placement   Placement
	GlobalShape []int64
	SplitDim    int32
	SplitOffset int64
	Replica     int32
	Replicas    int32
}

// Placement of a param (Param.Placement).
type Placement int32

const (
	PlacementWhole      Placement = C.SX_PLACEMENT_WHOLE
	PlacementReplicated Placement = C.SX_PLACEMENT_REPLICATED
	PlacementSplit      Placement = C.SX_PLACEMENT_SPLIT
)

// cInt64s copies v into C memory (nil for an empty v), which the caller frees.
func cInt64s(v []int64) *C.int64_t {
	if len(v) == 0 {
		return nil
	}
	out := (*C.int64_t)(C.malloc(C.size_t(8 * len(v))))
	for i, x := range v {
		unsafe.Slice(out, len(v))[i] = C.int64_t(x)
	}
	return out
}

// AddParam registers a param and returns its index. After Finalize (between steps), a
// param goes in a new unit, whose id is above every unit laid out so far, and has no
// views until the next Finalize lays it out.
func (g *ShardGroup) AddParam(p Param) (int32, error) {
	if err := noNUL("param name", p.Name); err != nil {
		return -1, err
	}
	if len(p.Shape) > MaxNdim {
		return -1, errorf(ErrInvalidArgument, "param %q has %d dimensions; at most %d", p.Name, len(p.Shape), MaxNdim)
	}
	var d C.sx_param_desc_t
	C.sx_param_desc_init(&d, C.size_t(unsafe.Sizeof(d)))
	name := C.CString(p.Name)
	defer C.free(unsafe.Pointer(name))
	d.name = name
	d.ndim = C.int32_t(len(p.Shape))
	d.dtype = C.int32_t(p.Dtype)
	// In C memory: d is Go memory passed to C and may not hold Go pointers.
	shape, global := cInt64s(p.Shape), cInt64s(p.GlobalShape)
	defer C.free(unsafe.Pointer(shape))
	defer C.free(unsafe.Pointer(global))
	d.shape = shape
	d.param_group = C.int32_t(p.ParamGroup)
	d.unit = C.int32_t(p.Unit)
	d.frozen = cbool(p.Frozen)
	d.placement = C.int32_t(p.Placement)
	d.global_shape = global
	d.split_dim = C.int32_t(p.SplitDim)
	d.split_offset = C.int64_t(p.SplitOffset)
	d.replica = C.int32_t(p.Replica)
	d.replicas = C.int32_t(p.Replicas)
	var index C.int32_t = -1
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_add_param(raw, &d, &index) })
	return int32(index), err
}

// Finalize (collective) checks every rank registered the same params, lays out and
// allocates. Called again after params were added, it lays out only those, in new units;
// the params laid out before keep their values, state and step counts. Ranks that
// disagree get ErrMismatch naming the first differing fact.
func (g *ShardGroup) Finalize() error {
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_finalize(raw) })
}

// BroadcastParams (collective) copies every param of rank root to all ranks.
func (g *ShardGroup) BroadcastParams(root int32) error {
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_broadcast_params(raw, C.int32_t(root)) })
}

// ReduceOp says how AllReduce combines the ranks' values.
type ReduceOp int32

const (
	ReduceSum  ReduceOp = C.SX_REDUCE_SUM
	ReduceMean ReduceOp = C.SX_REDUCE_MEAN // the sum divided by the world size
	ReduceMax  ReduceOp = C.SX_REDUCE_MAX
	ReduceMin  ReduceOp = C.SX_REDUCE_MIN
	// MaxAllReduce is the most values one AllReduce takes.
	MaxAllReduce = C.SX_MAX_ALL_REDUCE
)

// AllReduce (collective) combines the trainer's own numbers (a loss, token counts) over
// the ranks in place, element by element: sums in rank order (the same on every rank),
// NaN wins. At most MaxAllReduce values; every rank passes the same op and count. On an
// error the values are left as they were.
func (g *ShardGroup) AllReduce(values []float64, op ReduceOp) error {
	// C memory: sx may not keep Go memory, and a copy keeps the values on an error.
	n := len(values)
	size := n
	if size == 0 {
		size = 1
	}
	buf := (*[1 << 20]C.double)(C.malloc(C.size_t(size) * C.size_t(unsafe.Sizeof(C.double(0)))))[:size:size]
	defer C.free(unsafe.Pointer(&buf[0]))
	for i, v := range values {
		buf[i] = C.double(v)
	}
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
		return C.sx_all_reduce(raw, &buf[0], C.int32_t(n), C.int32_t(op))
	})
	if err == nil {
		for i := range values {
			values[i] = float64(buf[i])
		}
	}
	return err
}

// View is a raw window into sx's memory, valid until the group is closed.
type View struct {
	Data   unsafe.Pointer
	Numel  uint64
	Dtype  Dtype
	Device int32
}

// hostOf checks that the view is host memory of one of dtypes, which hold goType.
func (v View) hostOf(goType string, dtypes ...Dtype) error {
	for _, d := range dtypes {
		if v.Dtype == d && v.Device == DeviceCPU {
			return nil
		}
	}
	where := "host"
	if v.Device != DeviceCPU {
		where = "device"
	}
	names := make([]string, len(dtypes))
	for i, d := range dtypes {
		names[i] = d.String()
	}
	return errorf(ErrUnsupported, "%v data in %s memory cannot be viewed as []%s (only %s host memory can)",
		v.Dtype, where, goType, strings.Join(names, " or "))
}

// Float32s is the view's fp32 host memory as a zero-copy slice.
func (v View) Float32s() ([]float32, error) {
	if err := v.hostOf("float32", DtypeF32); err != nil {
		return nil, err
	}
	if v.Numel == 0 {
		return []float32{}, nil
	}
	return unsafe.Slice((*float32)(v.Data), int(v.Numel)), nil
}

// Uint16s is the view's fp16 or bf16 host memory as a zero-copy slice of the raw bits.
func (v View) Uint16s() ([]uint16, error) {
	if err := v.hostOf("uint16", DtypeF16, DtypeBF16); err != nil {
		return nil, err
	}
	if v.Numel == 0 {
		return []uint16{}, nil
	}
	return unsafe.Slice((*uint16)(v.Data), int(v.Numel)), nil
}

// Uint8s is the view's unsigned bytes in host memory (8-bit optimizer state's codes) as a
// zero-copy slice.
func (v View) Uint8s() ([]uint8, error) {
	if err := v.hostOf("uint8", DtypeU8); err != nil {
		return nil, err
	}
	if v.Numel == 0 {
		return []uint8{}, nil
	}
	return unsafe.Slice((*uint8)(v.Data), int(v.Numel)), nil
}

func (g *ShardGroup) view(grad bool, param int32) (View, error) {
	var v C.sx_view_t
	C.sx_view_init(&v, C.size_t(unsafe.Sizeof(v)))
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
		if grad {
			return C.sx_grad_view(raw, C.int32_t(param), &v)
		}
		return C.sx_param_view(raw, C.int32_t(param), &v)
	})
	return View{Data: v.data, Numel: uint64(v.numel), Dtype: Dtype(v.dtype), Device: int32(v.device)}, err
}

// ParamView is the raw view of a param's values (16-bit for an fp16 or bf16 param:
// see View.Uint16s).
func (g *ShardGroup) ParamView(param int32) (View, error) { return g.view(false, param) }

// GradView is the raw view of a param's gradient (16-bit for an fp16 or bf16 param,
// unless GroupConfig.GradDtype is DtypeF32).
func (g *ShardGroup) GradView(param int32) (View, error) { return g.view(true, param) }

func (g *ShardGroup) f32(grad bool, param int32) ([]float32, error) {
	v, err := g.view(grad, param)
	if err != nil {
		return nil, err
	}
	s, err := v.Float32s()
	if err != nil {
		what, call := "param", "ParamView"
		if grad {
			what, call = "grad", "GradView"
		}
		return nil, errorf(ErrUnsupported, "the %s of param %d: %s; use %s", what, param, err.(*Error).Message, call)
	}
	return s, nil
}

// Param returns a param's values: a zero-copy slice of sx's flat buffer, valid until
// Close. The trainer may write it between steps.
func (g *ShardGroup) Param(param int32) ([]float32, error) { return g.f32(false, param) }

// UnitView is the raw view of unit's whole flat buffer (an index, as GatherUnit's): its
// params, or with grad its gradients; PaddedNumel elements, each param at its
// OffsetInUnit. With GroupConfig.Alignment 1 the params are packed: one block, as a
// trainer that keeps all its params in one array has them (UnitView(u, g).Float32s());
// UnitLayout says whether a unit is packed, and how much padding follows its params.
func (g *ShardGroup) UnitView(unit int32, grad bool) (View, error) {
	var v C.sx_view_t
	C.sx_view_init(&v, C.size_t(unsafe.Sizeof(v)))
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
		return C.sx_unit_view(raw, C.int32_t(unit), cbool(grad), &v)
	})
	return View{Data: v.data, Numel: uint64(v.numel), Dtype: Dtype(v.dtype), Device: int32(v.device)}, err
}

// Grad returns a param's gradient, zero-copy; the trainer adds its gradient into it.
func (g *ShardGroup) Grad(param int32) ([]float32, error) { return g.f32(true, param) }

// FindParam returns the index of the param named name.
func (g *ShardGroup) FindParam(name string) (int32, error) {
	if err := noNUL("param name", name); err != nil {
		return -1, err
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var index C.int32_t = -1
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_find_param(raw, cname, &index) })
	return int32(index), err
}

// SetTrainable freezes (false) or unfreezes (true) a param from the next step on.
func (g *ShardGroup) SetTrainable(param int32, trainable bool) error {
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t {
		return C.sx_set_trainable(raw, C.int32_t(param), cbool(trainable))
	})
}

// Trainable reports whether a param is trainable.
func (g *ShardGroup) Trainable(param int32) (bool, error) {
	var t C.int32_t
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_get_trainable(raw, C.int32_t(param), &t) })
	return t != 0, err
}

// TrainableMask is the group-owned byte per param (1 trainable, 0 frozen), zero-copy;
// the next step picks up changes made through it.
func (g *ShardGroup) TrainableMask() ([]byte, error) {
	var mask *C.uint8_t
	var count C.int32_t
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_trainable_mask(raw, &mask, &count) })
	if err != nil || count == 0 || mask == nil {
		return []byte{}, err
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(mask)), int(count)), nil
}

// RefreshTrainable applies the current mask now.
func (g *ShardGroup) RefreshTrainable() error {
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_refresh_trainable(raw) })
}

// AccumulateGrads (collective) folds the current gradients into the step's accumulation:
// call it after the backward of every micro-batch but a step's last. At stage 2 (and 3)
// it then zeroes the gradients; at stage 1 it keeps them, and the next micro-batch adds
// to them.
func (g *ShardGroup) AccumulateGrads() error {
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_accumulate_grads(raw) })
}

// StepOptions of Step. Zero values are the defaults.
type StepOptions struct {
	MaxGradNorm float64 // clip the global gradient norm to this; 0 = no clipping
	// Do not zero the grads after the step (a backward that overwrites its gradients, or
	// zeroes them itself, saves a pass over memory). Their contents after the step are
	// then unspecified, not the gradients: the reduction may use them as scratch.
	KeepGrads bool
	Stream    unsafe.Pointer // a cudaStream_t (C memory), or nil
	// Stages 1 and 2: return after the update and gather the params in the background;
	// GatherUnit waits for a unit's.
	DeferGather bool
	// Uneven inputs: the gradients are sums over this rank's *Weight samples (or tokens),
	// and the step divides their sum over the ranks by the sum of every rank's weight, so
	// that the update is the one a single process would make over the union of the data.
	// A rank whose data ran out passes 0 and leaves its gradients at zero; if every rank
	// passes 0, the step is skipped (StepResult.Skipped) and nothing changes. Either every
	// rank sets a Weight (finite, >= 0) or none does (nil: each rank's gradients are its
	// mean, averaged over the ranks).
	Weight *float64
	// What gradients holding inf or NaN do (every rank the same); the zero value is
	// NonFiniteDefault.
	NonFinite NonFiniteMode
}

// NonFiniteMode says what gradients holding inf or NaN do at a step.
type NonFiniteMode int32

const (
	// Where the step needs the global norm first (clipping, dynamic loss scaling), a
	// non-finite norm skips the step on every rank; otherwise the update runs and inf/NaN
	// reach the params, as in torch.
	NonFiniteDefault NonFiniteMode = C.SX_NONFINITE_DEFAULT
	// The norm is always taken first, and a non-finite one skips the step.
	NonFiniteSkip NonFiniteMode = C.SX_NONFINITE_SKIP
	// As NonFiniteSkip, and Step then returns an error with ErrNonFinite.
	NonFiniteError NonFiniteMode = C.SX_NONFINITE_ERROR
)

// UnitReadyOptions of UnitGradsReady. Zero values are the defaults.
type UnitReadyOptions struct {
	Accumulate bool           // an intermediate micro-batch (AccumulateGrads ends it)
	Stream     unsafe.Pointer // the cudaStream_t the gradients were written on, or nil
}

// UnitGradsReady says that unit's gradients are complete for this micro-batch; sx
// reduces them on its own thread while the backward goes on. Any unit order. opts may
// be nil.
func (g *ShardGroup) UnitGradsReady(unit int32, opts *UnitReadyOptions) error {
	var o C.sx_unit_ready_options_t
	C.sx_unit_ready_options_init(&o, C.size_t(unsafe.Sizeof(o)))
	if opts != nil {
		o.accumulate = cbool(opts.Accumulate)
		o.stream = opts.Stream
	}
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_unit_grads_ready(raw, C.int32_t(unit), &o) })
}

// GatherUnit at stage 3 (collective) makes the unit's params present until
// ReleaseUnit; the slices Param returns for them are valid until then. At stages 1 and 2
// it waits for the unit's gather after a step with DeferGather.
func (g *ShardGroup) GatherUnit(unit int32) error {
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_unit_gather(raw, C.int32_t(unit)) })
}

// ReleaseUnit ends a GatherUnit at stage 3 (this rank keeps only its shard); else nothing.
func (g *ShardGroup) ReleaseUnit(unit int32) error {
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_unit_release(raw, C.int32_t(unit)) })
}

// StepResult of Step.
type StepResult struct {
	GradNorm  float64
	Step      uint64
	Skipped   bool    // skipped: inf/NaN gradients where they were checked, or no rank had data
	LossScale float64 // what to multiply the next losses by (1 without loss scaling)
	NonFinite bool    // the gradients' global norm was inf or NaN
}

// Step (collective) averages the gradients over ranks, clips, updates and gathers the
// params, then zeroes the gradients (every Grad slice, and UnitView's gradient buffers),
// so that the next backward adds into zeros as torch's does after zero_grad: a trainer
// that adds into them does not clear them itself (StepOptions.KeepGrads skips the
// zeroing and leaves them unspecified). opts may be nil.
func (g *ShardGroup) Step(opts *StepOptions) (StepResult, error) {
	var o C.sx_step_options_t
	C.sx_step_options_init(&o, C.size_t(unsafe.Sizeof(o)))
	op := (*C.sx_step_options_t)(nil)
	if opts != nil {
		o.max_grad_norm = C.double(opts.MaxGradNorm)
		o.keep_grads = cbool(opts.KeepGrads)
		o.stream = opts.Stream
		o.defer_gather = cbool(opts.DeferGather)
		if opts.Weight != nil {
			o.weighted, o.weight = 1, C.double(*opts.Weight)
		}
		o.nonfinite = C.int32_t(opts.NonFinite)
		op = &o
	}
	var r C.sx_step_result_t
	C.sx_step_result_init(&r, C.size_t(unsafe.Sizeof(r)))
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_step(raw, op, &r) })
	return StepResult{GradNorm: float64(r.grad_norm), Step: uint64(r.step), Skipped: r.skipped != 0,
		LossScale: float64(r.loss_scale), NonFinite: r.nonfinite != 0}, err
}

// LossScalingMode says how LossScaling treats the gradients.
type LossScalingMode int32

const (
	LossScalingNone    LossScalingMode = C.SX_LOSS_SCALING_NONE    // gradients are used as they are (the default)
	LossScalingDynamic LossScalingMode = C.SX_LOSS_SCALING_DYNAMIC // skip steps with inf/NaN gradients, back off and grow
	LossScalingStatic  LossScalingMode = C.SX_LOSS_SCALING_STATIC  // divide by InitScale, never skip
)

// LossScaling has torch.cuda.amp.GradScaler's semantics; zero fields take its defaults
// (InitScale 65536, GrowthFactor 2, BackoffFactor 0.5, GrowthInterval 2000).
type LossScaling struct {
	Mode           LossScalingMode
	InitScale      float64 // finite, > 0
	GrowthFactor   float64 // > 1
	BackoffFactor  float64 // in (0, 1)
	GrowthInterval int32   // steps in a row without inf/NaN before the scale grows; > 0
}

// SetLossScaling sets loss scaling (between steps; every rank the same) and resets the
// scale to InitScale.
func (g *ShardGroup) SetLossScaling(s LossScaling) error {
	var c C.sx_loss_scaling_t
	C.sx_loss_scaling_init(&c, C.size_t(unsafe.Sizeof(c)))
	c.mode = C.int32_t(s.Mode)
	c.init_scale, c.growth_factor, c.backoff_factor = C.double(s.InitScale), C.double(s.GrowthFactor), C.double(s.BackoffFactor)
	c.growth_interval = C.int32_t(s.GrowthInterval)
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_set_loss_scaling(raw, &c) })
}

// LossScale is what the next losses are to be multiplied by before backward (1 without
// loss scaling); Step divides the gradients by it.
func (g *ShardGroup) LossScale() (float64, error) {
	var v C.double
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_get_loss_scale(raw, &v) })
	return float64(v), err
}

func (g *ShardGroup) Rank() (int32, error) {
	return g.queryInt(func(r *C.sx_shard_group_t, v *C.int32_t) C.sx_status_t { return C.sx_get_rank(r, v) })
}
func (g *ShardGroup) WorldSize() (int32, error) {
	return g.queryInt(func(r *C.sx_shard_group_t, v *C.int32_t) C.sx_status_t { return C.sx_get_world_size(r, v) })
}
func (g *ShardGroup) Stage() (int32, error) {
	return g.queryInt(func(r *C.sx_shard_group_t, v *C.int32_t) C.sx_status_t { return C.sx_get_stage(r, v) })
}
func (g *ShardGroup) NumParams() (int32, error) {
	return g.queryInt(func(r *C.sx_shard_group_t, v *C.int32_t) C.sx_status_t { return C.sx_get_num_params(r, v) })
}
func (g *ShardGroup) NumUnits() (int32, error) {
	return g.queryInt(func(r *C.sx_shard_group_t, v *C.int32_t) C.sx_status_t { return C.sx_get_num_units(r, v) })
}
func (g *ShardGroup) NumParamGroups() (int32, error) {
	return g.queryInt(func(r *C.sx_shard_group_t, v *C.int32_t) C.sx_status_t { return C.sx_get_num_param_groups(r, v) })
}

// MemoryStats is what this rank holds, in bytes.
type MemoryStats struct {
	ParamBytes, GradBytes, OptimizerBytes, StagingBytes, UnshardedOptimizerBytes uint64
	// The most param bytes held at once (stage 3: shards plus gathered units).
	PeakParamBytes uint64
	// Memory copies of the state (GroupConfig.MemoryCopyInterval) held.
	MemoryCopyBytes uint64
	// Of the bytes above (but staging and memory copies), those in a CUDA device's memory
	// (GroupConfig.Offload keeps the masters and optimizer state off it); 0 for CPU groups.
	DeviceBytes uint64
}

func (g *ShardGroup) MemoryStats() (MemoryStats, error) {
	var s C.sx_memory_stats_t
	C.sx_memory_stats_init(&s, C.size_t(unsafe.Sizeof(s)))
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_get_memory_stats(raw, &s) })
	return MemoryStats{uint64(s.param_bytes), uint64(s.grad_bytes), uint64(s.optimizer_bytes), uint64(s.staging_bytes),
		uint64(s.unsharded_optimizer_bytes), uint64(s.peak_param_bytes), uint64(s.memory_copy_bytes),
		uint64(s.device_bytes)}, err
}

// ParamInfo describes a registered param and the part of it this rank's shard covers.
type ParamInfo struct {
	Name                 string
	Dtype                Dtype
	Shape                []int64
	Numel                uint64
	ParamGroup, Unit     int32
	Trainable            bool
	OffsetInUnit         uint64
	ShardBegin, ShardEnd uint64
}

func (g *ShardGroup) ParamInfo(param int32) (ParamInfo, error) {
	var i C.sx_param_info_t
	C.sx_param_info_init(&i, C.size_t(unsafe.Sizeof(i)))
	if err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_get_param_info(raw, C.int32_t(param), &i) }); err != nil {
		return ParamInfo{}, err
	}
	defer runtime.KeepAlive(g)
	info := ParamInfo{Name: C.GoString(i.name), Dtype: Dtype(i.dtype), Numel: uint64(i.numel),
		ParamGroup: int32(i.param_group), Unit: int32(i.unit), Trainable: i.trainable != 0,
		OffsetInUnit: uint64(i.offset_in_unit), ShardBegin: uint64(i.shard_begin), ShardEnd: uint64(i.shard_end)}
	for d := 0; d < int(i.ndim) && d < MaxNdim; d++ {
		info.Shape = append(info.Shape, int64(i.shape[d]))
	}
	return info, nil
}

// UnitInfo describes one unit's flat buffer and this rank's shard of it, and the mesh:
// this rank is ShardRank of its shard group's ShardSize ranks and ReplicaRank of the
// Replicas groups that hold the same shards.
type UnitInfo struct {
	Unit, NumParams                             int32
	Numel, PaddedNumel, ShardNumel, ShardBegin  uint64
	Trainable, HasOptimizerState                bool
	ShardSize, ShardRank, Replicas, ReplicaRank int32
}

// UnitInfo of the index-th unit (0..NumUnits-1, by increasing unit id).
func (g *ShardGroup) UnitInfo(index int32) (UnitInfo, error) {
	var u C.sx_unit_info_t
	C.sx_unit_info_init(&u, C.size_t(unsafe.Sizeof(u)))
	err := g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_get_unit_info(raw, C.int32_t(index), &u) })
	return UnitInfo{int32(u.unit), int32(u.num_params), uint64(u.numel), uint64(u.padded_numel), uint64(u.shard_numel),
		uint64(u.shard_begin), u.trainable != 0, u.has_optimizer_state != 0, int32(u.shard_size), int32(u.shard_rank),
		int32(u.replicas), int32(u.replica_rank)}, err
}

// UnitLayout is how a unit's params lie in its flat buffer (UnitView), from their
// offsets (ParamInfo.OffsetInUnit) and UnitInfo: what a trainer that keeps all its
// params in one array checks before it takes the buffer as that array.
type UnitLayout struct {
	// The unit's params, in the order of the buffer (registration order), and where
	// each starts in it, in elements.
	Params  []int32
	Offsets []uint64
	// Packed: the first param starts at element 0 and each other where the one before
	// ends, so that the buffer's first UnitInfo.Numel elements are the params as one
	// block. GroupConfig.Alignment 1 packs every unit; with the default alignment a unit
	// is packed only where each param's size is a multiple of it.
	Packed bool
	// Elements between params (alignment gaps; 0 when Packed), and after the last param
	// up to UnitInfo.PaddedNumel (so that the buffer splits into equal shards; zero, and
	// ignored by the step).
	Gaps, Padding uint64
}

// UnitLayout of the index-th unit (as UnitInfo's and UnitView's). After Finalize. The C
// API has no such call: the binding derives it from sx_get_unit_info and every param's
// sx_get_param_info (a call per param of the group).
func (g *ShardGroup) UnitLayout(index int32) (UnitLayout, error) {
	info, err := g.UnitInfo(index)
	if err != nil {
		return UnitLayout{}, err
	}
	n, err := g.NumParams()
	if err != nil {
		return UnitLayout{}, err
	}
	var l UnitLayout
	var end uint64
	for p := int32(0); p < n; p++ {
		pi, err := g.ParamInfo(p)
		if err != nil {
			return UnitLayout{}, err
		}
		if pi.Unit != info.Unit {
			continue
		}
		l.Params = append(l.Params, p)
		l.Offsets = append(l.Offsets, pi.OffsetInUnit)
		l.Gaps += pi.OffsetInUnit - end
		end = pi.OffsetInUnit + pi.Numel
	}
	l.Packed = l.Gaps == 0
	l.Padding = info.PaddedNumel - end
	return l, nil
}

// Load flags (LoadOptions sets them from its booleans).
const (
	LoadParamsOnly   = C.SX_LOAD_PARAMS_ONLY
	LoadAllowMissing = C.SX_LOAD_ALLOW_MISSING
	LoadAllowExtra   = C.SX_LOAD_ALLOW_EXTRA
)

// LoadOptions of Load.
type LoadOptions struct {
	Path         string
	ParamsOnly   bool // values only: no optimizer state, steps or hyperparameters
	AllowMissing bool // group params absent from the checkpoint keep their values
	AllowExtra   bool // checkpoint params absent from the group are ignored
}

// Load (collective) loads a checkpoint saved at any world size into this group.
func (g *ShardGroup) Load(opts LoadOptions) error {
	if err := noNUL("path", opts.Path); err != nil {
		return err
	}
	var o C.sx_load_options_t
	C.sx_load_optim_state_options_init(&o, C.size_t(unsafe.Sizeof(o)))
	path := C.CString(opts.Path)
	defer C.free(unsafe.Pointer(path))
	o.path = path
	if opts.ParamsOnly {
		o.flags |= LoadParamsOnly
	}
	if opts.AllowMissing {
		o.flags |= LoadAllowMissing
	}
	if opts.AllowExtra {
		o.flags |= LoadAllowExtra
	}
	return g.do(func(raw *C.sx_shard_group_t) C.sx_status_t { return C.sx_load_optim_state(raw, &o) })
}
