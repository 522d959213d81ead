package sx

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func rendezvous(name string) string { return fmt.Sprintf("local://go-%d-%s", os.Getpid(), name) }

func config(rdv string, rank, world int32) GroupConfig {
	return GroupConfig{Rendezvous: rdv, Rank: rank, WorldSize: world, Stage: 2, Backend: BackendCPU, NumThreads: 1,
		TimeoutMs: 60000}
}

// runRanks runs fn on world ranks, one goroutine each, locked to its OS thread while it
// uses sx; it fails the test with every rank's error.
func runRanks(t *testing.T, name string, world int32, fn func(rank int32, g *ShardGroup) error) {
	t.Helper()
	runRanksWith(t, name, world, nil, fn)
}

// runRanks with each rank's config changed by edit first.
func runRanksWith(t *testing.T, name string, world int32, edit func(*GroupConfig), fn func(rank int32, g *ShardGroup) error) {
	t.Helper()
	rdv := rendezvous(name)
	eachRank(t, world, func(rank int32) error {
		cfg := config(rdv, rank, world)
		if edit != nil {
			edit(&cfg)
		}
		g, err := NewShardGroup(cfg)
		if err != nil {
			return err
		}
		defer g.Close()
		return fn(rank, g)
	})
}

// eachRank runs fn on world goroutines, one per rank, each locked to its OS thread while it
// uses sx; it fails the test with every rank's error.
func eachRank(t *testing.T, world int32, fn func(rank int32) error) {
	t.Helper()
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := int32(0); r < world; r++ {
		wg.Add(1)
		go func(rank int32) {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			errs[rank] = fn(rank)
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

func statusOf(err error) int32 {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return -1
}

func TestErrorsCarryStatusAndMessage(t *testing.T) {
	g, err := NewShardGroup(config(rendezvous("errors"), 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.AddParam(Param{Name: "w", Shape: []int64{4}}); statusOf(err) != ErrInvalidArgument {
		t.Errorf("a param in a missing param group gave %v", err)
	}
	if _, err := g.AddParamGroup(NewParamGroup(SGD)); err != nil {
		t.Fatal(err)
	}
	_, err = g.AddParam(Param{Name: "", Shape: []int64{4}})
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.Contains(e.Message, "name") {
		t.Fatalf("an empty name gave %v", err)
	}
	if s := err.Error(); !strings.HasPrefix(s, "SX_ERR_INVALID_ARGUMENT: ") || !strings.HasSuffix(s, e.Message) {
		t.Errorf("Error() is %q", s)
	}
	if _, err := g.AddParam(Param{Name: "deep", Shape: make([]int64, 9)}); statusOf(err) != ErrInvalidArgument ||
		!strings.Contains(err.Error(), "deep") {
		t.Errorf("9 dimensions gave %v", err)
	}
	if _, err := g.AddParam(Param{Name: "w", Shape: []int64{4}}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.AddParam(Param{Name: "w", Shape: []int64{4}}); statusOf(err) != ErrAlreadyExists {
		t.Errorf("a duplicate name gave %v", err)
	}
	if _, err := g.Param(0); statusOf(err) != ErrInvalidState {
		t.Errorf("a view before finalize gave %v", err)
	}
	if err := g.Finalize(); err != nil {
		t.Fatal(err)
	}
	if _, err := g.FindParam("nope"); statusOf(err) != ErrNotFound || !strings.Contains(err.Error(), "nope") {
		t.Errorf("a missing name gave %v", err)
	}
	if err := g.SetLR(0, -1); statusOf(err) != ErrInvalidArgument {
		t.Errorf("a negative lr gave %v", err)
	}
	if _, err := NewShardGroup(config("nosuch://x", 0, 1)); statusOf(err) != ErrInvalidArgument ||
		!strings.Contains(err.Error(), "nosuch") {
		t.Errorf("a bad rendezvous gave %v", err)
	}
	if _, err := ReadUserBlob("/nonexistent/sx/ckpt"); err == nil || !strings.Contains(err.Error(), "/nonexistent/sx/ckpt") {
		t.Errorf("a missing checkpoint gave %v", err)
	}
}

// residentBytes is this process's resident memory (Linux).
func residentBytes(t *testing.T) int64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skipf("no /proc/self/statm: %v", err)
	}
	var size, resident int64
	fmt.Sscan(string(data), &size, &resident)
	return resident * int64(os.Getpagesize())
}

// bigGroup makes a group whose param and grad buffers hold 64 MiB, all touched.
func bigGroup(t *testing.T, name string) *ShardGroup {
	g, err := NewShardGroup(config(rendezvous(name), 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	g.AddParamGroup(NewParamGroup(SGD))
	if _, err := g.AddParam(Param{Name: "big", Shape: []int64{8 << 20}}); err != nil {
		t.Fatal(err)
	}
	if err := g.Finalize(); err != nil {
		t.Fatal(err)
	}
	p, _ := g.Param(0)
	gr, _ := g.Grad(0)
	for k := range p {
		p[k], gr[k] = 1, 1
	}
	return g
}

const released = 48 << 20

func TestCloseReleasesAndRejectsLaterUse(t *testing.T) {
	g := bigGroup(t, "close")
	before := residentBytes(t)
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if after := residentBytes(t); before-after < released {
		t.Errorf("Close released %d bytes of a group holding 64 MiB", before-after)
	}
	if err := g.Close(); err != nil {
		t.Errorf("a second Close gave %v", err)
	}
	if _, err := g.Rank(); statusOf(err) != ErrInvalidHandle {
		t.Errorf("a call after Close gave %v", err)
	}
}

func TestFinalizerReleasesAForgottenGroup(t *testing.T) {
	before := atomic.LoadInt64(&groupsFinalized)
	bigGroup(t, "finalizer")
	deadline := time.Now().Add(20 * time.Second)
	for atomic.LoadInt64(&groupsFinalized) == before && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	if atomic.LoadInt64(&groupsFinalized) == before {
		t.Errorf("the finalizer did not release a forgotten group within 20 s")
	}
}

const nW = 37

func target(k int) float32 { return float32(math.Sin(float64(k) * 0.37)) }

// lossAndGrad: 0.5*|w-target|^2, gradient scaled per rank so only the average over
// ranks drives w to the target.
func lossAndGrad(rank int32, w, g []float32) float64 {
	scale := 0.5 + float32(rank)*0.25
	loss := 0.0
	for k := range w {
		d := w[k] - target(k)
		loss += 0.5 * float64(d*d)
		g[k] += scale * d
	}
	return loss
}

func setup(g *ShardGroup, lr float64) error {
	pg := NewParamGroup(AdamW)
	pg.LR = lr
	if _, err := g.AddParamGroup(pg); err != nil {
		return err
	}
	if _, err := g.AddParam(Param{Name: "w", Shape: []int64{nW}, Unit: 0}); err != nil {
		return err
	}
	if _, err := g.AddParam(Param{Name: "frozen", Shape: []int64{3, 5}, Unit: 1, Frozen: true}); err != nil {
		return err
	}
	return g.Finalize()
}

func trainStep(rank int32, g *ShardGroup) (float64, error) {
	w, err := g.Param(0)
	if err != nil {
		return 0, err
	}
	gr, err := g.Grad(0)
	if err != nil {
		return 0, err
	}
	loss := lossAndGrad(rank, w, gr)
	_, err = g.Step(nil)
	return loss, err
}

func TestFourRanksTrainAndTheLossFalls(t *testing.T) {
	finals := make([][]float32, 4)
	var losses []float64
	runRanks(t, "train4", 4, func(rank int32, g *ShardGroup) error {
		if err := setup(g, 0.05); err != nil {
			return err
		}
		if r, _ := g.Rank(); r != rank {
			return fmt.Errorf("Rank() is %d", r)
		}
		if n, _ := g.WorldSize(); n != 4 {
			return fmt.Errorf("WorldSize() is %d", n)
		}
		frozen, _ := g.Param(1)
		frozen0 := append([]float32(nil), frozen...)
		var mine []float64
		for s := 0; s < 30; s++ {
			loss, err := trainStep(rank, g)
			if err != nil {
				return err
			}
			mine = append(mine, loss)
		}
		if !reflect.DeepEqual(frozen, frozen0) {
			return fmt.Errorf("the frozen param changed")
		}
		if n, err := g.ParamGroupSteps(0); err != nil || n != 30 {
			return fmt.Errorf("ParamGroupSteps(0) = %d, %v after 30 steps", n, err)
		}
		if _, err := g.ParamGroupSteps(1); statusOf(err) != ErrInvalidArgument {
			return fmt.Errorf("ParamGroupSteps(1) of a group with one param group gave %v", err)
		}
		info, err := g.ParamInfo(0)
		if err != nil || info.Name != "w" || !reflect.DeepEqual(info.Shape, []int64{nW}) {
			return fmt.Errorf("ParamInfo(0) = %+v, %v", info, err)
		}
		m, err := g.MemoryStats()
		if err != nil || m.OptimizerBytes >= m.UnshardedOptimizerBytes {
			return fmt.Errorf("optimizer state not sharded: %+v %v", m, err)
		}
		w, _ := g.Param(0)
		finals[rank] = append([]float32(nil), w...)
		if rank == 0 {
			losses = mine
		}
		return nil
	})
	if !(losses[29] < 0.1*losses[0]) {
		t.Errorf("the loss did not fall: %v", losses)
	}
	for r := 1; r < 4; r++ {
		if !reflect.DeepEqual(finals[r], finals[0]) {
			t.Errorf("rank %d holds other params than rank 0", r)
		}
	}
}

func TestFreezingIsPickedUp(t *testing.T) {
	runRanks(t, "freeze", 2, func(rank int32, g *ShardGroup) error {
		pg := NewParamGroup(SGD)
		pg.LR = 0.1
		g.AddParamGroup(pg)
		g.AddParam(Param{Name: "a", Shape: []int64{5}})
		g.AddParam(Param{Name: "b", Shape: []int64{6}})
		if err := g.Finalize(); err != nil {
			return err
		}
		stepOnes := func() error {
			for i := int32(0); i < 2; i++ {
				gr, err := g.Grad(i)
				if err != nil {
					return err
				}
				for k := range gr {
					gr[k] = 1
				}
			}
			_, err := g.Step(nil)
			return err
		}
		moved := func(i int32) bool {
			p, _ := g.Param(i)
			return math.Abs(float64(p[0])+0.1) < 1e-6
		}
		if err := g.SetTrainable(1, false); err != nil {
			return err
		}
		if err := stepOnes(); err != nil {
			return err
		}
		if !moved(0) || moved(1) {
			return fmt.Errorf("after freezing b: a moved %v, b moved %v", moved(0), moved(1))
		}
		mask, err := g.TrainableMask()
		if err != nil || !reflect.DeepEqual(mask, []byte{1, 0}) {
			return fmt.Errorf("mask %v, %v", mask, err)
		}
		mask[0], mask[1] = 0, 1
		if err := stepOnes(); err != nil {
			return err
		}
		if tr, _ := g.Trainable(0); tr || !moved(0) || !moved(1) {
			return fmt.Errorf("after flipping the mask: a trainable %v", tr)
		}
		return nil
	})
}

func TestSaveAndLoadReshardFourToTwo(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ckpt-1")
	blob := make([]byte, 300)
	for i := range blob {
		blob[i] = byte(i * 7 % 251)
	}
	saved := make([][]float32, 4)
	var totals [4]uint64
	runRanks(t, "save4", 4, func(rank int32, g *ShardGroup) error {
		if err := setup(g, 0.05); err != nil {
			return err
		}
		for s := 0; s < 3; s++ {
			if _, err := trainStep(rank, g); err != nil {
				return err
			}
		}
		done := make(chan error, 1)
		f, err := g.Save(SaveOptions{Path: path, UserBlob: blob, OnComplete: func(err error) { done <- err }})
		if err != nil {
			return err
		}
		defer f.Close()
		if err := f.WaitStaged(); err != nil {
			return err
		}
		if err := f.Wait(); err != nil {
			return err
		}
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("the callback got %v", err)
			}
		case <-time.After(60 * time.Second):
			return fmt.Errorf("the save callback never ran")
		}
		if ok, err := f.Poll(); !ok || err != nil {
			return fmt.Errorf("Poll after Wait: %v %v", ok, err)
		}
		d, total, err := f.Progress()
		if err != nil || d != total {
			return fmt.Errorf("progress %d of %d, %v", d, total, err)
		}
		totals[rank] = total
		w, _ := g.Param(0)
		saved[rank] = append([]float32(nil), w...)
		_, err = trainStep(rank, g) // after the save: must not reach the checkpoint
		return err
	})
	if totals[0]+totals[1]+totals[2]+totals[3] == 0 {
		t.Error("the save wrote no bytes")
	}
	got, err := ReadUserBlob(path)
	if err != nil || !reflect.DeepEqual(got, blob) {
		t.Fatalf("user blob %v, %v", len(got), err)
	}
	runRanks(t, "load2", 2, func(rank int32, g *ShardGroup) error {
		if err := setup(g, 0.5); err != nil {
			return err
		}
		if err := g.Load(LoadOptions{Path: path}); err != nil {
			return err
		}
		w, _ := g.Param(0)
		if !reflect.DeepEqual(w, saved[0]) {
			return fmt.Errorf("params loaded into 2 ranks differ from those saved by 4")
		}
		if lr, err := g.GetHyperparameter(0, HPLR); err != nil || lr != 0.05 {
			return fmt.Errorf("lr after load %v, %v", lr, err)
		}
		if err := g.Load(LoadOptions{Path: filepath.Join(dir, "nope")}); err == nil || !strings.Contains(err.Error(), "nope") {
			return fmt.Errorf("loading a missing checkpoint gave %v", err)
		}
		return nil
	})
}

func TestBF16ParamsWithFP32GradsAndLossScaling(t *testing.T) {
	cfg := config(rendezvous("bf16"), 0, 1)
	cfg.GradDtype = DtypeF32
	g, err := NewShardGroup(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	pg := NewParamGroup(SGD)
	pg.LR = 0.5
	if _, err := g.AddParamGroup(pg); err != nil {
		t.Fatal(err)
	}
	if _, err := g.AddParam(Param{Name: "w", Shape: []int64{2, 3}, Dtype: DtypeBF16}); err != nil {
		t.Fatal(err)
	}
	if err := g.Finalize(); err != nil {
		t.Fatal(err)
	}
	pv, err := g.ParamView(0)
	if err != nil || pv.Dtype != DtypeBF16 || pv.Numel != 6 {
		t.Fatalf("ParamView(0) = %+v, %v", pv, err)
	}
	// A view of the wrong element type is refused, saying what the memory holds.
	if _, err := g.Param(0); statusOf(err) != ErrUnsupported || !strings.Contains(err.Error(), "bf16") {
		t.Errorf("Param of a bf16 param gave %v", err)
	}
	gv, err := g.GradView(0)
	if err != nil || gv.Dtype != DtypeF32 {
		t.Fatalf("GradView(0) = %+v, %v", gv, err)
	}
	if _, err := gv.Uint16s(); statusOf(err) != ErrUnsupported || !strings.Contains(err.Error(), "[]uint16") {
		t.Errorf("Uint16s of an fp32 grad gave %v", err)
	}
	w, err := pv.Uint16s()
	if err != nil {
		t.Fatal(err)
	}
	for k := range w {
		w[k] = 0x3f80 // bf16 1.0, the top half of fp32 1.0's bits; the masters start from it
	}
	gr, err := g.Grad(0)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := g.LossScale(); err != nil || s != 1 {
		t.Errorf("the loss scale without loss scaling is %v, %v", s, err)
	}
	if err := g.SetLossScaling(LossScaling{Mode: LossScalingDynamic, InitScale: 1024}); err != nil {
		t.Fatal(err)
	}
	if s, err := g.LossScale(); err != nil || s != 1024 {
		t.Errorf("the loss scale after SetLossScaling is %v, %v", s, err)
	}
	// Gradients of the loss times 1024; the step divides them by it: SGD, lr 0.5 takes
	// 1.0 to 0.5 (bf16 0x3f00).
	for k := range gr {
		gr[k] = 1024
	}
	r, err := g.Step(nil)
	if err != nil || r.Skipped || r.Step != 1 || r.LossScale != 1024 {
		t.Fatalf("Step = %+v, %v", r, err)
	}
	for k := range w {
		if w[k] != 0x3f00 {
			t.Fatalf("bf16 params after the step: %#x", w)
		}
	}
	// An inf gradient: the step is skipped and the scale backs off by half.
	gr[4] = float32(math.Inf(1))
	r, err = g.Step(nil)
	if err != nil || !r.Skipped || r.Step != 1 || r.LossScale != 512 || w[4] != 0x3f00 {
		t.Fatalf("Step with an inf gradient = %+v, %v; params %#x", r, err, w)
	}
	// A refused setting changes nothing.
	err = g.SetLossScaling(LossScaling{Mode: LossScalingDynamic, BackoffFactor: 1.5})
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.Contains(e.Message, "backoff_factor") {
		t.Errorf("backoff_factor 1.5 gave %v", err)
	}
	if s, err := g.LossScale(); err != nil || s != 512 {
		t.Errorf("the loss scale after a refused setting is %v, %v", s, err)
	}
}

// pipelineRun trains three units for three steps on `world` ranks (shard groups of
// shardSize; 0: flat) at `stage`; with overlap each unit's gradients are signalled ready
// in the backward and the gather is deferred. Every unit is gathered around its use
// (which stage 3 needs). Returns each rank's params and rank 0's peak param bytes.
func pipelineRun(t *testing.T, name string, world, shardSize, stage int32, overlap bool) ([][][]float32, uint64) {
	out := make([][][]float32, world)
	var peak uint64
	rdv := rendezvous(name)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := int32(0); r < world; r++ {
		wg.Add(1)
		go func(rank int32) {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cfg := config(rdv, rank, world)
			cfg.Stage = stage
			cfg.PrefetchDepth = 1
			cfg.ShardSize = shardSize
			g, err := NewShardGroup(cfg)
			if err != nil {
				errs[rank] = err
				return
			}
			defer g.Close()
			errs[rank] = func() error {
				pg := NewParamGroup(AdamW)
				pg.LR = 0.01
				if _, err := g.AddParamGroup(pg); err != nil {
					return err
				}
				for u := int32(0); u < 3; u++ {
					if _, err := g.AddParam(Param{Name: fmt.Sprintf("p%d", u), Shape: []int64{int64(40 + 13*u)}, Unit: u}); err != nil {
						return err
					}
				}
				if err := g.Finalize(); err != nil {
					return err
				}
				s := shardSize
				if s == 0 {
					s = world
				}
				info, err := g.UnitInfo(0)
				if err != nil {
					return err
				}
				if info.ShardSize != s || info.ShardRank != rank%s || info.Replicas != world/s || info.ReplicaRank != rank/s {
					return fmt.Errorf("unit info %+v: not shard %d of %d, replica %d of %d", info, rank%s, s, rank/s, world/s)
				}
				use := func(u int32, fn func() error) error {
					if err := g.GatherUnit(u); err != nil {
						return err
					}
					if err := fn(); err != nil {
						return err
					}
					return g.ReleaseUnit(u)
				}
				for u := int32(0); u < 3; u++ {
					if err := use(u, func() error {
						p, err := g.Param(u)
						for k := range p {
							p[k] = float32(k) * 0.01
						}
						return err
					}); err != nil {
						return err
					}
				}
				for s := 0; s < 3; s++ {
					for u := int32(2); u >= 0; u-- {
						if err := use(u, func() error {
							gr, err := g.Grad(u)
							for k := range gr {
								gr[k] += float32((k*7+s+int(rank))%11)/8 - 0.625
							}
							return err
						}); err != nil {
							return err
						}
						if overlap {
							if err := g.UnitGradsReady(u, nil); err != nil {
								return err
							}
						}
					}
					if _, err := g.Step(&StepOptions{DeferGather: overlap}); err != nil {
						return err
					}
				}
				for u := int32(0); u < 3; u++ {
					if err := use(u, func() error {
						p, err := g.Param(u)
						out[rank] = append(out[rank], append([]float32(nil), p...))
						return err
					}); err != nil {
						return err
					}
				}
				m, err := g.MemoryStats()
				if rank == 0 {
					peak = m.PeakParamBytes
				}
				return err
			}()
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("stage %d overlap %v rank %d: %v", stage, overlap, r, err)
		}
	}
	return out, peak
}

// sameParams fails the test where got and want differ anywhere.
func sameParams(t *testing.T, what string, got, want [][][]float32) {
	t.Helper()
	for r := range want {
		for u := range want[r] {
			for k := range want[r][u] {
				if got[r][u][k] != want[r][u][k] {
					t.Fatalf("%s rank %d unit %d [%d]: %v, want %v", what, r, u, k, got[r][u][k], want[r][u][k])
				}
			}
		}
	}
}

func TestAPackedUnitIsOneBlockBehindOneSlice(t *testing.T) {
	cfg := config(rendezvous("packed"), 0, 1)
	cfg.Alignment = 1
	g, err := NewShardGroup(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	pg := NewParamGroup(SGD)
	pg.LR = 0.5
	if _, err := g.AddParamGroup(pg); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Param{{Name: "a", Shape: []int64{2, 3}}, {Name: "b", Shape: []int64{5}}} {
		if _, err := g.AddParam(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Finalize(); err != nil {
		t.Fatal(err)
	}
	if l, err := g.UnitLayout(0); err != nil || !l.Packed || l.Gaps != 0 || l.Padding != 0 ||
		!reflect.DeepEqual(l.Params, []int32{0, 1}) || !reflect.DeepEqual(l.Offsets, []uint64{0, 6}) {
		t.Fatalf("the packed unit's layout: %+v, %v", l, err)
	}
	if _, err := g.UnitLayout(1); statusOf(err) != ErrInvalidArgument {
		t.Errorf("the layout of a unit out of range gave %v", err)
	}
	pv, err := g.UnitView(0, false)
	if err != nil {
		t.Fatal(err)
	}
	block, err := pv.Float32s()
	if err != nil || len(block) != 11 {
		t.Fatalf("the packed block: %d elements, %v", len(block), err)
	}
	for i := range block {
		block[i] = 1
	}
	if b, _ := g.Param(1); b[0] != 1 || b[4] != 1 {
		t.Errorf("param b is not in the block: %v", b)
	}
	gv, _ := g.UnitView(0, true)
	grads, _ := gv.Float32s()
	for i := range grads {
		grads[i] = 2
	}
	if _, err := g.Step(nil); err != nil {
		t.Fatal(err)
	}
	if block[0] != 0 || block[10] != 0 {
		t.Errorf("after the step: %v", block)
	}
	if _, err := g.UnitView(1, false); statusOf(err) != ErrInvalidArgument {
		t.Errorf("a unit out of range gave %v", err)
	}
}

// With the default alignment (64 bytes: 16 floats) a unit of params of 6 and 5 floats
// is not packed: the second param starts at 16, and the buffer ends padded to 32 (a
// multiple of world size times the alignment); one of 16 and 5 floats is.
func TestUnitLayoutSaysWhetherAUnitIsPacked(t *testing.T) {
	g, err := NewShardGroup(config(rendezvous("layout"), 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.AddParamGroup(NewParamGroup(SGD)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Param{{Name: "a", Shape: []int64{2, 3}}, {Name: "b", Shape: []int64{5}, Unit: 0},
		{Name: "c", Shape: []int64{4, 4}, Unit: 1}, {Name: "d", Shape: []int64{5}, Unit: 1}} {
		if _, err := g.AddParam(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Finalize(); err != nil {
		t.Fatal(err)
	}
	l, err := g.UnitLayout(0)
	if err != nil || l.Packed || l.Gaps != 10 || l.Padding != 11 || !reflect.DeepEqual(l.Offsets, []uint64{0, 16}) {
		t.Errorf("unit 0: %+v, %v", l, err)
	}
	l, err = g.UnitLayout(1)
	if err != nil || !l.Packed || l.Padding != 11 || !reflect.DeepEqual(l.Params, []int32{2, 3}) {
		t.Errorf("unit 1: %+v, %v", l, err)
	}
}

// A save whose parent directory is missing fails in Save itself, naming the directory,
// not later in Wait; one into an existing directory then succeeds.
func TestASaveIntoAMissingDirectoryFailsAtOnce(t *testing.T) {
	g, err := NewShardGroup(config(rendezvous("save-missing"), 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := setup(g, 0.1); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	missing := filepath.Join(dir, "no-such-dir")
	f, err := g.Save(SaveOptions{Path: filepath.Join(missing, "step-1")})
	if f != nil || statusOf(err) != ErrNotFound || !strings.Contains(err.Error(), "'"+missing+"' does not exist") {
		t.Fatalf("a save into a missing directory: future %v, error %v", f, err)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("the failed save made %s: %v", missing, err)
	}
	f, err = g.Save(SaveOptions{Path: filepath.Join(dir, "step-1")})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Wait(); err != nil {
		t.Fatal(err)
	}
}

func TestAllReduceCombinesTheTrainersNumbers(t *testing.T) {
	rdv := rendezvous("allreduce")
	got := make([][][]float64, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for rank := int32(0); rank < 3; rank++ {
		wg.Add(1)
		go func(rank int32) {
			defer wg.Done()
			g, err := NewShardGroup(config(rdv, rank, 3))
			if err != nil {
				errs[rank] = err
				return
			}
			defer g.Close()
			for _, op := range []ReduceOp{ReduceSum, ReduceMean, ReduceMax, ReduceMin} {
				v := []float64{float64(rank), -float64(rank), 0.5}
				if err := g.AllReduce(v, op); err != nil {
					errs[rank] = err
					return
				}
				got[rank] = append(got[rank], v)
			}
			// Different ops: told, and the values stay.
			v := []float64{1}
			op := ReduceSum
			if rank == 2 {
				op = ReduceMax
			}
			err = g.AllReduce(v, op)
			if statusOf(err) != ErrMismatch || !strings.Contains(err.Error(), "op: sum on ranks 0, 1, max on rank 2") || v[0] != 1 {
				errs[rank] = fmt.Errorf("different ops gave %v, values %v", err, v)
			}
		}(rank)
	}
	wg.Wait()
	want := [][]float64{{3, -3, 1.5}, {1, -1, 0.5}, {2, 0, 0.5}, {0, -2, 0.5}}
	for rank := 0; rank < 3; rank++ {
		if errs[rank] != nil {
			t.Fatalf("rank %d: %v", rank, errs[rank])
		}
		if !reflect.DeepEqual(got[rank], want) {
			t.Errorf("rank %d got %v, want %v", rank, got[rank], want)
		}
	}
}

func TestNamesAndPathsHoldingANulAreRefused(t *testing.T) {
	// C would read them only up to the NUL: another name or path than the one given.
	if _, err := NewShardGroup(config("local://a\x00b", 0, 1)); statusOf(err) != ErrInvalidArgument ||
		!strings.Contains(err.Error(), "NUL") {
		t.Errorf("a rendezvous with a NUL gave %v", err)
	}
	g, err := NewShardGroup(config(rendezvous("nul"), 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.AddParamGroup(NewParamGroup(SGD)); err != nil {
		t.Fatal(err)
	}
	if _, err := g.AddParam(Param{Name: "a\x00b", Shape: []int64{2}}); statusOf(err) != ErrInvalidArgument {
		t.Errorf("a param name with a NUL gave %v", err)
	}
	if _, err := g.AddParam(Param{Name: "w", Shape: []int64{2}}); err != nil {
		t.Fatal(err)
	}
	if err := g.Finalize(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := g.Save(SaveOptions{Path: filepath.Join(dir, "a\x00b"), Synchronous: true}); statusOf(err) != ErrInvalidArgument {
		t.Errorf("a save path with a NUL gave %v", err)
	}
	if err := g.Load(LoadOptions{Path: filepath.Join(dir, "a\x00b")}); statusOf(err) != ErrInvalidArgument {
		t.Errorf("a load path with a NUL gave %v", err)
	}
	if _, err := ReadUserBlob(filepath.Join(dir, "a\x00b")); statusOf(err) != ErrInvalidArgument {
		t.Errorf("a blob path with a NUL gave %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the refused save left %d entries", len(entries))
	}
}

// A finalized group of cfg with one SGD param group (learning rate lr) and one param, w of 4.
func oneParamGroup(t *testing.T, cfg GroupConfig, lr float64) *ShardGroup {
	g, err := NewShardGroup(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pg := NewParamGroup(SGD)
	pg.LR = lr
	if _, err := g.AddParamGroup(pg); err != nil {
		g.Close()
		t.Fatal(err)
	}
	if _, err := g.AddParam(Param{Name: "w", Shape: []int64{4}}); err != nil {
		g.Close()
		t.Fatal(err)
	}
	if err := g.Finalize(); err != nil {
		g.Close()
		t.Fatal(err)
	}
	return g
}

func TestAdagradAndRMSpropGroupsTakeTheirDefaults(t *testing.T) {
	runRanks(t, "adagrad", 1, func(rank int32, g *ShardGroup) error {
		rms := NewParamGroup(RMSprop)
		rms.Centered, rms.Momentum = true, 0.5
		bad := NewParamGroup(Adagrad)
		bad.Alpha = 0.5 // RMSprop's, not Adagrad's
		if _, err := g.AddParamGroup(NewParamGroup(Adagrad)); err != nil {
			return err
		} else if _, err := g.AddParamGroup(rms); err != nil {
			return err
		} else if _, err := g.AddParamGroup(bad); statusOf(err) != ErrInvalidArgument {
			return fmt.Errorf("Adagrad with alpha: %v", err)
		}
		for i, name := range []string{"w", "v"} {
			if _, err := g.AddParam(Param{Name: name, Shape: []int64{4}, ParamGroup: int32(i)}); err != nil {
				return err
			}
		}
		if err := g.Finalize(); err != nil {
			return err
		}
		for _, c := range []struct {
			group int32
			key   Hyperparameter
			want  float64
		}{{0, HPLR, 1e-2}, {0, HPEps, 1e-10}, {0, HPLRDecay, 0}, {0, HPInitialAccumulatorValue, 0},
			{1, HPLR, 1e-2}, {1, HPAlpha, 0.99}, {1, HPEps, 1e-8}, {1, HPCentered, 1}, {1, HPMomentum, 0.5}} {
			if v, err := g.GetHyperparameter(c.group, c.key); err != nil || v != c.want {
				return fmt.Errorf("group %d key %d: %v, %v; want %v", c.group, c.key, v, err, c.want)
			}
		}
		return nil
	})
}

func TestNonFiniteGradientsSkipOrFailTheStep(t *testing.T) {
	g := oneParamGroup(t, config(rendezvous("nonfinite"), 0, 1), 0.5)
	defer g.Close()
	w, _ := g.Param(0)
	gr, _ := g.Grad(0)
	for k := range w {
		w[k] = 1
	}
	// Clipping checks the norm: a NaN skips the step, and says so.
	copy(gr, []float32{1, float32(math.NaN()), 1, 1})
	r, err := g.Step(&StepOptions{MaxGradNorm: 1})
	if err != nil || !r.Skipped || !r.NonFinite || r.Step != 0 || w[0] != 1 {
		t.Fatalf("a NaN with clipping: %+v, %v, w %v", r, err, w)
	}
	// NonFiniteError: skipped, then an error.
	copy(gr, []float32{float32(math.Inf(1)), 1, 1, 1})
	if _, err := g.Step(&StepOptions{NonFinite: NonFiniteError}); statusOf(err) != ErrNonFinite || w[0] != 1 {
		t.Fatalf("an inf with NonFiniteError: %v, w %v", err, w)
	}
	copy(gr, []float32{1, 1, 1, 1})
	r, err = g.Step(&StepOptions{NonFinite: NonFiniteSkip})
	if err != nil || r.Skipped || r.NonFinite || r.Step != 1 || w[0] != 0.5 {
		t.Fatalf("a finite step: %+v, %v, w %v", r, err, w)
	}
}

func TestOverlapAndStage3GiveThePlainParams(t *testing.T) {
	plain, plainPeak := pipelineRun(t, "pipe-plain", 2, 0, 2, false)
	for _, c := range []struct {
		stage   int32
		overlap bool
	}{{2, true}, {1, true}, {3, false}, {3, true}} {
		got, peak := pipelineRun(t, fmt.Sprintf("pipe-%d-%v", c.stage, c.overlap), 2, 0, c.stage, c.overlap)
		sameParams(t, fmt.Sprintf("stage %d overlap %v", c.stage, c.overlap), got, plain)
		if c.stage == 3 && (peak == 0 || peak >= 2*plainPeak) {
			t.Errorf("stage 3 peak param bytes %d, stage 2's %d", peak, plainPeak)
		}
	}
}

// HSDP: 4 ranks as 2 shard groups of 2 (and 4 of 1) train as the flat group of 4, bit
// for bit; a shard size that does not divide the world size is refused.
func TestAMeshTrainsAsTheFlatGroup(t *testing.T) {
	flat, _ := pipelineRun(t, "mesh-flat", 4, 0, 2, false)
	for _, c := range []struct {
		shard, stage int32
		overlap      bool
	}{{2, 2, true}, {2, 3, true}, {1, 1, false}} {
		got, _ := pipelineRun(t, fmt.Sprintf("mesh-%d-%d", c.shard, c.stage), 4, c.shard, c.stage, c.overlap)
		sameParams(t, fmt.Sprintf("shard size %d stage %d", c.shard, c.stage), got, flat)
	}
	cfg := config(rendezvous("mesh-bad"), 0, 1)
	cfg.ShardSize = 2
	_, err := NewShardGroup(cfg)
	if err == nil || !strings.Contains(err.Error(), "shard_size 2 does not divide the world size 1") {
		t.Fatalf("a shard size of 2 at world size 1: %v", err)
	}
}

// openSockets counts the sockets this process has open (Linux; 0 without /proc).
func openSockets() int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// transportRun trains 2 ranks for three AdamW steps with clipping over transport; it
// returns each rank's params and last grad norm, and the sockets the process held as
// each rank's group had just connected.
func transportRun(t *testing.T, name string, transport Transport) ([][][]float32, []float64, []int) {
	out := make([][][]float32, 2)
	norms := make([]float64, 2)
	sockets := make([]int, 2)
	rdv := rendezvous(name)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := int32(0); r < 2; r++ {
		wg.Add(1)
		go func(rank int32) {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			errs[rank] = func() error {
				cfg := config(rdv, rank, 2)
				cfg.Transport = transport
				g, err := NewShardGroup(cfg)
				if err != nil {
					return err
				}
				defer g.Close()
				sockets[rank] = openSockets() // this rank's connections are open now
				pg := NewParamGroup(AdamW)
				pg.LR = 0.01
				if _, err := g.AddParamGroup(pg); err != nil {
					return err
				}
				if _, err := g.AddParam(Param{Name: "w", Shape: []int64{7, 9}, Unit: 0}); err != nil {
					return err
				}
				if _, err := g.AddParam(Param{Name: "b", Shape: []int64{9}, Unit: 1}); err != nil {
					return err
				}
				if err := g.Finalize(); err != nil {
					return err
				}
				w, err := g.Param(0)
				if err != nil {
					return err
				}
				for k := range w {
					w[k] = float32(k) * 0.01
				}
				for s := 0; s < 3; s++ {
					for p := int32(0); p < 2; p++ {
						gr, err := g.Grad(p)
						if err != nil {
							return err
						}
						for k := range gr {
							gr[k] = float32((k*7+s+int(rank))%11)/8 - 0.625
						}
					}
					res, err := g.Step(&StepOptions{MaxGradNorm: 1})
					if err != nil {
						return err
					}
					norms[rank] = res.GradNorm
				}
				for p := int32(0); p < 2; p++ {
					v, err := g.Param(p)
					if err != nil {
						return err
					}
					out[rank] = append(out[rank], append([]float32(nil), v...))
				}
				return nil
			}()
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("transport %d rank %d: %v", transport, r, err)
		}
	}
	return out, norms, sockets
}

// TransportTCP (Gloo's TCP between ranks that are goroutines of this process) trains as
// TransportAuto (shared memory here), bit for bit; a value the library does not know is
// refused, naming the field.
func TestTCPTransportTrainsAsAuto(t *testing.T) {
	auto, autoNorms, _ := transportRun(t, "transport-auto", TransportAuto)
	tcp, tcpNorms, sockets := transportRun(t, "transport-tcp", TransportTCP)
	sameParams(t, "auto, rank 1 against rank 0", [][][]float32{auto[1]}, [][][]float32{auto[0]})
	if auto[0][0][1] == 0.01 {
		t.Fatalf("nothing trained: %v", auto[0][0][:4])
	}
	sameParams(t, "tcp against auto", tcp, auto)
	for r := range autoNorms {
		if math.Float64bits(tcpNorms[r]) != math.Float64bits(autoNorms[r]) || autoNorms[r] != autoNorms[0] {
			t.Fatalf("rank %d: grad norm %v over TCP, %v (rank 0: %v) over auto", r, tcpNorms[r], autoNorms[r], autoNorms[0])
		}
	}
	if _, err := os.Stat("/proc/self/fd"); err == nil && (sockets[0] == 0 || sockets[1] == 0) {
		t.Errorf("sockets open under TransportTCP: %v; the option did not reach the library", sockets)
	}
	cfg := config(rendezvous("transport-bad"), 0, 1)
	cfg.Transport = 7
	if _, err := NewShardGroup(cfg); statusOf(err) != ErrInvalidArgument || !strings.Contains(err.Error(), "transport") {
		t.Errorf("Transport 7: %v", err)
	}
}

// Each rank's trace file, written by FlushTrace and by Close, names every step and each
// reduce-scatter by unit id with its bytes; an unwritable one is ErrIO naming the file.
func TestRanksWriteTheirTraces(t *testing.T) {
	dir := t.TempDir()
	template := filepath.Join(dir, "t-%r.json")
	rdv := rendezvous("trace")
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := int32(0); r < 2; r++ {
		wg.Add(1)
		go func(rank int32) {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			errs[rank] = func() error {
				cfg := config(rdv, rank, 2)
				cfg.TracePath, cfg.TraceEvents = template, 1000
				g, err := NewShardGroup(cfg)
				if err != nil {
					return err
				}
				defer g.Close()
				pg := NewParamGroup(SGD)
				pg.LR = 0.1
				if _, err := g.AddParamGroup(pg); err != nil {
					return err
				}
				if _, err := g.AddParam(Param{Name: "w", Shape: []int64{3, 5}, Unit: 4}); err != nil {
					return err
				}
				if err := g.Finalize(); err != nil {
					return err
				}
				if _, err := g.Step(nil); err != nil {
					return err
				}
				if err := g.FlushTrace(); err != nil {
					return err
				}
				if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("t-%d.json", rank))); err != nil {
					return fmt.Errorf("FlushTrace wrote no file: %v", err)
				}
				_, err = g.Step(nil)
				return err
			}()
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := 0; r < 2; r++ {
		data, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("t-%d.json", r)))
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			OtherData struct {
				Rank     int `json:"rank"`
				Capacity int `json:"capacity"`
			} `json:"otherData"`
			TraceEvents []struct {
				Ph   string         `json:"ph"`
				Name string         `json:"name"`
				Pid  int            `json:"pid"`
				Args map[string]any `json:"args"`
			} `json:"traceEvents"`
		}
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatalf("rank %d's trace is not JSON: %v", r, err)
		}
		if doc.OtherData.Rank != r || doc.OtherData.Capacity != 1000 {
			t.Errorf("rank %d's trace: otherData %+v", r, doc.OtherData)
		}
		steps, reductions := 0, 0
		for _, e := range doc.TraceEvents {
			if e.Ph != "X" {
				continue
			}
			if e.Pid != r {
				t.Errorf("rank %d's trace has an event of pid %d", r, e.Pid)
			}
			if e.Name == "sx_step" {
				steps++
			}
			if e.Name == "reduce_scatter" {
				reductions++
				// 15 floats padded to 2 x 16.
				if e.Args["unit"] != 4.0 || e.Args["bytes"] != 128.0 {
					t.Errorf("rank %d: reduce_scatter args %v", r, e.Args)
				}
			}
		}
		if steps != 2 || reductions != 2 {
			t.Errorf("rank %d's trace: %d steps and %d reduce-scatters, 2 of each expected", r, steps, reductions)
		}
	}
	cfg := config(rendezvous("trace-bad"), 0, 1)
	cfg.TracePath = "/nonexistent-sx-dir/t.json"
	g, err := NewShardGroup(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.FlushTrace(); statusOf(err) != ErrIO || !strings.Contains(err.Error(), "/nonexistent-sx-dir/t.rank0.json") {
		t.Errorf("an unwritable trace: %v", err)
	}
	cfg = config(rendezvous("trace-neg"), 0, 1)
	cfg.TraceEvents = -1
	if _, err := NewShardGroup(cfg); statusOf(err) != ErrInvalidArgument || !strings.Contains(err.Error(), "trace_events") {
		t.Errorf("TraceEvents -1: %v", err)
	}
}

func TestStage3ViewsNeedAGather(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cfg := config(rendezvous("pipe-views"), 0, 1)
	cfg.Stage = 3
	g := oneParamGroup(t, cfg, 0.1)
	defer g.Close()
	if _, err := g.Param(0); statusOf(err) != ErrInvalidState {
		t.Errorf("a view of an ungathered unit: %v", err)
	}
	if err := g.GatherUnit(0); err != nil {
		t.Fatal(err)
	}
	if p, err := g.Param(0); err != nil || len(p) != 4 {
		t.Errorf("a view of a gathered unit: %v %v", p, err)
	}
	if err := g.ReleaseUnit(0); err != nil {
		t.Fatal(err)
	}
	if err := g.ReleaseUnit(0); statusOf(err) != ErrInvalidState {
		t.Errorf("a release without a gather: %v", err)
	}
	if err := g.UnitGradsReady(0, &UnitReadyOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := g.UnitGradsReady(0, nil); statusOf(err) != ErrInvalidState {
		t.Errorf("a unit signalled twice: %v", err)
	}
	if _, err := g.Step(nil); err != nil {
		t.Fatal(err)
	}
}

// freePort is a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestRendezvousTokenRefusesAWrongOneAndAdmitsTheRightOne(t *testing.T) {
	port := freePort(t)
	url := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cfg := config(url, 0, 2)
		cfg.RendezvousToken, cfg.RendezvousBind = "go-secret", "*"
		g, err := NewShardGroup(cfg)
		if err == nil {
			g.Close()
		}
		done <- err
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// "localhost": another spelling of the address, so that this refused attempt does
	// not count as one of this process's groups on the others' URL (key_space.cc).
	wrong := config(fmt.Sprintf("tcp://localhost:%d", port), 1, 2)
	wrong.RendezvousToken = "not-it"
	_, err := NewShardGroup(wrong)
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.Contains(e.Message, "does not match") ||
		strings.Contains(e.Message, "go-secret") || strings.Contains(e.Message, "not-it") {
		t.Fatalf("a wrong token gave %v", err)
	}
	right := config(url, 1, 2)
	right.RendezvousToken = "go-secret"
	g, err := NewShardGroup(right)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	if err := <-done; err != nil {
		t.Fatalf("rank 0: %v", err)
	}
	if s := fmt.Sprintf("%v %#v", right, right); strings.Contains(s, "go-secret") {
		t.Errorf("the token shows in %s", s)
	}
}

func TestWorldSizeBeyondTheMaximumIsRefused(t *testing.T) {
	_, err := NewShardGroup(config(rendezvous("maxworld"), 0, MaxWorldSize+1))
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.Contains(e.Message, "SX_MAX_WORLD_SIZE") {
		t.Fatalf("world size %d gave %v", MaxWorldSize+1, err)
	}
}

func TestFinalizeReservesTheCheckpointStagingWhenAsked(t *testing.T) {
	for _, reserve := range []bool{false, true} {
		cfg := config(rendezvous(fmt.Sprintf("reserve-%v", reserve)), 0, 1)
		if reserve {
			cfg.Flags |= GroupFlagReserveCheckpointStaging
		}
		g, err := NewShardGroup(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.AddParamGroup(NewParamGroup(Adam)); err != nil {
			t.Fatal(err)
		}
		if _, err := g.AddParam(Param{Name: "w", Shape: []int64{1000}}); err != nil {
			t.Fatal(err)
		}
		if err := g.Finalize(); err != nil {
			t.Fatal(err)
		}
		m, err := g.MemoryStats()
		// Adam's values and two states, 4000 bytes each, each on a 4 KiB boundary.
		want := uint64(0)
		if reserve {
			want = 2*4096 + 4000
		}
		if err != nil || m.StagingBytes != want {
			t.Errorf("reserve %v: staging %d bytes, want %d (%v)", reserve, m.StagingBytes, want, err)
		}
		g.Close()
	}
}

// Three ranks save, step on and abort; rank 2 leaves and ranks 0 and 1 regroup into two
// from the checkpoint: the result names the new places and the checkpoint's step, and
// the params are the checkpoint's.
func TestTwoSurvivorsOfThreeRegroup(t *testing.T) {
	path := filepath.Join(t.TempDir(), "step-2")
	saved := make([][]float32, 3)
	var left sync.WaitGroup
	left.Add(3)
	runRanks(t, "regroup3", 3, func(rank int32, g *ShardGroup) error {
		if err := setup(g, 0.05); err != nil {
			return err
		}
		for s := 0; s < 2; s++ {
			if _, err := trainStep(rank, g); err != nil {
				return err
			}
		}
		f, err := g.Save(SaveOptions{Path: path, Synchronous: true})
		if err != nil {
			return err
		}
		err = f.Wait()
		f.Close()
		if err != nil {
			return err
		}
		w, _ := g.Param(0)
		saved[rank] = append([]float32(nil), w...)
		if _, err := trainStep(rank, g); err != nil { // a step the regroup takes back
			return err
		}
		if err := g.Abort(); err != nil {
			return err
		}
		left.Done()
		left.Wait()
		if rank == 2 {
			return nil // lost
		}
		// Threads of one process: no process is known to have exited.
		if lost, err := g.LostRanks(); err != nil || len(lost) != 0 {
			return fmt.Errorf("LostRanks() = %v, %v; want none", lost, err)
		}
		r, err := g.Regroup(RegroupOptions{Checkpoint: LoadOptions{Path: path}, ExpectedWorldSize: 2})
		if err != nil {
			return err
		}
		want := RegroupResult{Epoch: 1, Rank: rank, WorldSize: 2, ShardSize: 2, PreviousRank: rank,
			PreviousWorldSize: 3, Step: 2}
		if r != want {
			return fmt.Errorf("regroup gave %+v, want %+v", r, want)
		}
		if world, err := g.WorldSize(); err != nil || world != 2 {
			return fmt.Errorf("world size after the regroup %d, %v", world, err)
		}
		w, _ = g.Param(0)
		if !reflect.DeepEqual(w, saved[rank]) {
			return fmt.Errorf("the params after the regroup are not the checkpoint's")
		}
		_, err = trainStep(rank, g)
		return err
	})
}

// The same with memory copies kept every step and no checkpoint: the two survivors'
// state is their copies' (rank 2's shard from rank 0, its successor).
func TestTwoSurvivorsOfThreeRegroupFromMemory(t *testing.T) {
	saved := make([][]float32, 3)
	var left sync.WaitGroup
	left.Add(3)
	runRanksWith(t, "regroupmem", 3, func(c *GroupConfig) { c.MemoryCopyInterval = 1 }, func(rank int32, g *ShardGroup) error {
		if err := setup(g, 0.05); err != nil {
			return err
		}
		for s := 0; s < 2; s++ {
			if _, err := trainStep(rank, g); err != nil {
				return err
			}
		}
		w, _ := g.Param(0)
		saved[rank] = append([]float32(nil), w...)
		if m, err := g.MemoryStats(); err != nil || m.MemoryCopyBytes == 0 {
			return fmt.Errorf("memory stats %+v, %v: no memory copies held", m, err)
		}
		if err := g.Abort(); err != nil {
			return err
		}
		left.Done()
		left.Wait()
		if rank == 2 {
			return nil // lost
		}
		r, err := g.Regroup(RegroupOptions{ExpectedWorldSize: 2})
		if err != nil {
			return err
		}
		want := RegroupResult{Epoch: 1, Rank: rank, WorldSize: 2, ShardSize: 2, PreviousRank: rank,
			PreviousWorldSize: 3, Step: 2, FromMemory: true}
		if r != want {
			return fmt.Errorf("regroup gave %+v, want %+v", r, want)
		}
		w, _ = g.Param(0)
		if !reflect.DeepEqual(w, saved[rank]) {
			return fmt.Errorf("the params after the regroup are not those of step 2")
		}
		_, err = trainStep(rank, g)
		return err
	})
}

// A 4th process (a goroutine with GroupFlagJoin) joins 3 ranks: they poll until they see
// it and admit it; the 4 then hold the params of the step it joined at.
func TestAProcessJoins(t *testing.T) {
	rdv := rendezvous("join")
	params := make([][]float32, 4)
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for r := int32(0); r < 4; r++ {
		wg.Add(1)
		go func(rank int32) {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cfg := config(rdv, rank, 3)
			if rank == 3 {
				cfg = config(rdv, 0, 1)
				cfg.Flags |= GroupFlagJoin
			}
			g, err := NewShardGroup(cfg)
			if err != nil {
				errs[rank] = err
				return
			}
			defer g.Close()
			errs[rank] = func() error {
				if err := setup(g, 0.05); err != nil {
					return err
				}
				var r RegroupResult
				if rank == 3 {
					if r, err = g.Regroup(RegroupOptions{}); err != nil {
						return err
					}
					if r.PreviousRank != -1 {
						return fmt.Errorf("the joiner's result %+v", r)
					}
				} else {
					for s := 0; s < 2; s++ {
						if _, err := trainStep(rank, g); err != nil {
							return err
						}
					}
					w, _ := g.Param(0)
					params[rank] = append([]float32(nil), w...)
					var waiting int32
					for k := 0; k < 3000 && waiting == 0; k++ {
						if waiting, err = g.PollJoiners(); err != nil {
							return err
						}
						time.Sleep(10 * time.Millisecond)
					}
					if r, err = g.Regroup(RegroupOptions{Admit: waiting}); err != nil {
						return err
					}
				}
				if r.WorldSize != 4 || r.Rank != rank || r.Step != 2 || !r.FromMemory {
					return fmt.Errorf("regroup gave %+v", r)
				}
				if rank == 3 {
					w, _ := g.Param(0)
					params[3] = append([]float32(nil), w...)
				}
				_, err := trainStep(r.Rank, g)
				return err
			}()
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if !t.Failed() && !reflect.DeepEqual(params[3], params[0]) {
		t.Errorf("the joiner's params are not the members' at the step it joined")
	}
}
