package sx

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
)

// Two slices (each a group of one rank) of a tensor split in halves, joined to one norm
// domain, take the norm of the whole tensor (the replicated param counted once) and clip
// by it alike; a bad placement is refused.
func TestNormDomainTwoSlices(t *testing.T) {
	type out struct {
		norm float64
		w    []float32
		err  error
	}
	outs := make([]out, 2)
	var wg sync.WaitGroup
	for rank := int32(0); rank < 2; rank++ {
		wg.Add(1)
		go func(rank int32) {
			defer wg.Done()
			o := &outs[rank]
			o.err = func() error {
				g, err := NewShardGroup(GroupConfig{Rendezvous: rendezvous(fmt.Sprintf("nd-g%d", rank)), WorldSize: 1,
					Backend: BackendCPU, NumThreads: 1, TimeoutMs: 60000})
				if err != nil {
					return err
				}
				defer g.Close()
				pg := NewParamGroup(SGD)
				pg.LR = 1
				if _, err := g.AddParamGroup(pg); err != nil {
					return err
				}
				if _, err := g.AddParam(Param{Name: "w", Shape: []int64{2}, Placement: PlacementSplit,
					GlobalShape: []int64{4}, SplitOffset: 2 * int64(rank)}); err != nil {
					return err
				}
				if _, err := g.AddParam(Param{Name: "b", Shape: []int64{1}, Placement: PlacementReplicated,
					Replica: rank, Replicas: 2}); err != nil {
					return err
				}
				if err := g.Finalize(); err != nil {
					return err
				}
				d, err := NewNormDomain(NormDomainConfig{Rendezvous: rendezvous("nd-domain"), Rank: rank, WorldSize: 2,
					TimeoutMs: 60000})
				if err != nil {
					return err
				}
				if err := g.JoinNormDomain(d, rank); err != nil {
					return err
				}
				d.Close() // the group keeps the domain alive
				gw, _ := g.Grad(0)
				if rank == 0 {
					gw[0], gw[1] = 3, 0
				} else {
					gw[0], gw[1] = 0, 4
				}
				gb, _ := g.Grad(1)
				gb[0] = 1
				r, err := g.Step(&StepOptions{MaxGradNorm: 1})
				if err != nil {
					return err
				}
				w, _ := g.Param(0)
				o.norm, o.w = r.GradNorm, append([]float32(nil), w...)
				return nil
			}()
		}(rank)
	}
	wg.Wait()
	for r, o := range outs {
		if o.err != nil {
			t.Fatalf("rank %d: %v", r, o.err)
		}
	}
	norm := math.Sqrt(26)
	if outs[0].norm != outs[1].norm || math.Abs(outs[0].norm-norm) > 1e-12 {
		t.Fatalf("norms %v and %v, want both %v", outs[0].norm, outs[1].norm, norm)
	}
	coef := 1 / (norm + 1e-6)
	if math.Abs(float64(outs[0].w[0])+3*coef) > 1e-6 || math.Abs(float64(outs[1].w[1])+4*coef) > 1e-6 {
		t.Fatalf("w after the step: %v and %v", outs[0].w, outs[1].w)
	}
}

func TestNormDomainBadPlacement(t *testing.T) {
	g, err := NewShardGroup(GroupConfig{Rendezvous: rendezvous("nd-bad"), WorldSize: 1, Backend: BackendCPU, NumThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.AddParamGroup(NewParamGroup(SGD)); err != nil {
		t.Fatal(err)
	}
	_, err = g.AddParam(Param{Name: "w", Shape: []int64{4, 5}, Placement: PlacementSplit, GlobalShape: []int64{8, 5},
		SplitOffset: 6})
	if err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("a piece that does not fit: %v", err)
	}
}
