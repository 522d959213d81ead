package sx

import (
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Contexts over local:// with ranks as goroutines: two groups made in one by name, each
// finalized and stepped; the context's stats; a duplicate live name refused; and the
// lifetime of the handle against its groups.

const contextWorld = 2

func contextConfig(rdv string, rank int32) ContextConfig {
	return ContextConfig{Rendezvous: rdv, Rank: rank, WorldSize: contextWorld, Backend: BackendCPU, NumThreads: 1,
		TimeoutMs: 60000}
}

// trainOnce registers w of n values under SGD (lr 1), finalizes, writes 1 into every
// gradient and steps once; it fails unless that was step 1 and every value is -1.
func trainOnce(g *ShardGroup, n int64) error {
	pg := NewParamGroup(SGD)
	pg.LR = 1
	if _, err := g.AddParamGroup(pg); err != nil {
		return err
	}
	if _, err := g.AddParam(Param{Name: "w", Shape: []int64{n}}); err != nil {
		return err
	}
	if err := g.Finalize(); err != nil {
		return err
	}
	grad, err := g.Grad(0)
	if err != nil {
		return err
	}
	for i := range grad {
		grad[i] = 1
	}
	r, err := g.Step(nil)
	if err != nil {
		return err
	}
	w, err := g.Param(0)
	if err != nil {
		return err
	}
	want := make([]float32, n)
	for i := range want {
		want[i] = -1
	}
	if r.Step != 1 || !reflect.DeepEqual(w, want) {
		return fmt.Errorf("after step %d: w = %v, want %v", r.Step, w, want)
	}
	return nil
}

// runContextRanks runs fn(rank, ctx) on contextWorld ranks (eachRank), each with a context
// of its own rank over one local:// rendezvous.
func runContextRanks(t *testing.T, name string, edit func(*ContextConfig), fn func(rank int32, ctx *Context) error) {
	t.Helper()
	rdv := rendezvous(name)
	eachRank(t, contextWorld, func(rank int32) error {
		cfg := contextConfig(rdv, rank)
		if edit != nil {
			edit(&cfg)
		}
		ctx, err := NewContext(cfg)
		if err != nil {
			return err
		}
		defer ctx.Close()
		return fn(rank, ctx)
	})
}

func TestContextTwoGroups(t *testing.T) {
	runContextRanks(t, "context-two", nil, func(rank int32, ctx *Context) error {
		a, err := NewShardGroup(GroupConfig{Context: ctx, Name: "tenant-a"})
		if err != nil {
			return err
		}
		defer a.Close()
		b, err := NewShardGroup(GroupConfig{Context: ctx, Name: "tenant-b", Stage: 1})
		if err != nil {
			return err
		}
		defer b.Close()
		if r, _ := a.Rank(); r != rank {
			return fmt.Errorf("group a's rank is %d", r)
		}
		if s, _ := b.Stage(); s != 1 {
			return fmt.Errorf("group b's stage is %d", s)
		}
		if err := trainOnce(a, 16); err != nil {
			return fmt.Errorf("group a: %v", err)
		}
		if err := trainOnce(b, 8); err != nil {
			return fmt.Errorf("group b: %v", err)
		}
		s, err := ctx.Stats()
		if err != nil {
			return err
		}
		// No Gloo channels in shared memory: nothing kept beside the groups' memory.
		if s.Groups != 2 || s.GroupsCreated != 2 || !s.SharedMemory || s.MemoryBytes == 0 || s.Channels < 2 ||
			s.TransportBytes != 0 {
			return fmt.Errorf("with two groups: %+v", s)
		}
		// A live group's name is refused on every rank, and nothing is made.
		if g, err := NewShardGroup(GroupConfig{Context: ctx, Name: "tenant-a"}); statusOf(err) != ErrInvalidState || g != nil {
			return fmt.Errorf("a duplicate live name gave %v", err)
		}
		if err := a.Close(); err != nil {
			return err
		}
		if err := b.Close(); err != nil {
			return err
		}
		if s, err = ctx.Stats(); err != nil {
			return err
		}
		if s.Groups != 0 || s.MemoryBytes != 0 || s.GroupsCreated != 2 {
			return fmt.Errorf("after both went: %+v", s)
		}
		// A gone group's name may be used again.
		again, err := NewShardGroup(GroupConfig{Context: ctx, Name: "tenant-a"})
		if err != nil {
			return err
		}
		defer again.Close()
		return trainOnce(again, 4)
	})
}

func TestContextGroupsOutliveTheHandle(t *testing.T) {
	budget := func(c *ContextConfig) { c.MemoryBudgetBytes = 1 << 20 }
	runContextRanks(t, "context-outlive", budget, func(rank int32, ctx *Context) error {
		if s, err := ctx.Stats(); err != nil || s.MemoryBudgetBytes != 1<<20 {
			return fmt.Errorf("stats %+v, %v", s, err)
		}
		g, err := NewShardGroup(GroupConfig{Context: ctx, Name: "kept"})
		if err != nil {
			return err
		}
		defer g.Close()
		if err := ctx.Close(); err != nil {
			return err
		}
		if err := ctx.Close(); err != nil { // idempotent
			return err
		}
		if _, err := ctx.Stats(); statusOf(err) != ErrInvalidHandle {
			return fmt.Errorf("stats of a closed context gave %v", err)
		}
		if _, err := NewShardGroup(GroupConfig{Context: ctx, Name: "refused"}); statusOf(err) != ErrInvalidHandle {
			return fmt.Errorf("a group in a closed context gave %v", err)
		}
		// The group goes on in the context after its handle went.
		return trainOnce(g, 4)
	})
}

func TestContextArguments(t *testing.T) {
	ctx, err := NewContext(ContextConfig{Rendezvous: rendezvous("context-args"), WorldSize: 1, Backend: BackendCPU,
		NumThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	// A group in a context needs a name; the fields the context owns must match it.
	if _, err := NewShardGroup(GroupConfig{Context: ctx}); statusOf(err) != ErrInvalidArgument ||
		!strings.Contains(err.Error(), "name") {
		t.Errorf("no name gave %v", err)
	}
	if _, err := NewShardGroup(GroupConfig{Context: ctx, Name: "x", Rendezvous: "local://elsewhere"}); statusOf(err) != ErrInvalidArgument ||
		!strings.Contains(err.Error(), "rendezvous") {
		t.Errorf("another rendezvous gave %v", err)
	}
	if _, err := NewShardGroup(GroupConfig{Context: ctx, Name: "a\x00b"}); statusOf(err) != ErrInvalidArgument {
		t.Errorf("a name with a NUL gave %v", err)
	}
	if s, err := ctx.Stats(); err != nil || s.GroupsCreated != 0 {
		t.Errorf("after refused groups: %+v, %v", s, err)
	}
	cfg := config(rendezvous("context-args-none"), 0, 1)
	cfg.Name = "x"
	if _, err := NewShardGroup(cfg); statusOf(err) != ErrInvalidArgument {
		t.Errorf("a name without a context gave %v", err)
	}
}

func TestFinalizerReleasesAForgottenContext(t *testing.T) {
	before := atomic.LoadInt64(&contextsFinalized)
	func() {
		ctx, err := NewContext(ContextConfig{Rendezvous: rendezvous("context-finalizer"), WorldSize: 1,
			Backend: BackendCPU, NumThreads: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ctx.Stats(); err != nil {
			t.Fatal(err)
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for atomic.LoadInt64(&contextsFinalized) == before && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	if atomic.LoadInt64(&contextsFinalized) == before {
		t.Errorf("the finalizer did not release a forgotten context within 20 s")
	}
}
