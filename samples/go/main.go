// The bindings' sample in Go: a linear regression trained by 4 ranks (goroutines of
// this process, each locked to its OS thread) with ZeRO-2 AdamW. samples/LINREG.md
// specifies every number; the output matches samples/c/train_linreg.c bit for bit.
//
// usage: train_linreg [--steps N] [--save DIR] [--load DIR]
package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"sync"

	sx "github.com/sx-runtime/sx/bindings/go"
)

const (
	ranks = 4
	out   = 8
	in    = 16
	batch = 4
)

// The explicit float64(...) conversions around products keep the compiler from fusing
// them with the following add (Go allows that on some CPUs): LINREG.md's numbers
// round every product.
type rng struct{ state uint64 }

func (r *rng) next() float64 {
	r.state = r.state*6364136223846793005 + 1442695040888963407
	return float64(float64(r.state>>11)*0x1p-53*2.0) - 1.0
}

type args struct {
	steps      uint64
	save, load string
	rendezvous string
}

func runRank(rank int32, a *args) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var tw [out][in]float64
	var tb [out]float64
	teacher := rng{7}
	for i := range tw {
		for j := range tw[i] {
			tw[i][j] = teacher.next()
		}
	}
	for i := range tb {
		tb[i] = teacher.next()
	}

	g, err := sx.NewShardGroup(sx.GroupConfig{Rendezvous: a.rendezvous, Rank: rank, WorldSize: ranks, Stage: 2,
		Backend: sx.BackendCPU, NumThreads: 1})
	if err != nil {
		return err
	}
	defer g.Close()
	pg := sx.NewParamGroup(sx.AdamW)
	pg.LR = 0.05
	if _, err := g.AddParamGroup(pg); err != nil {
		return err
	}
	if _, err := g.AddParam(sx.Param{Name: "w", Shape: []int64{out, in}, Unit: 0}); err != nil {
		return err
	}
	if _, err := g.AddParam(sx.Param{Name: "b", Shape: []int64{out}, Unit: 1}); err != nil {
		return err
	}
	if err := g.Finalize(); err != nil {
		return err
	}
	var views [4][]float32
	for k, get := range []func(int32) ([]float32, error){g.Param, g.Param, g.Grad, g.Grad} {
		if views[k], err = get(int32(k % 2)); err != nil {
			return err
		}
	}
	w, b, dw, db := views[0], views[1], views[2], views[3]

	var step uint64
	if a.load != "" {
		if err := g.Load(sx.LoadOptions{Path: a.load}); err != nil {
			return err
		}
		blob, err := sx.ReadUserBlob(a.load)
		if err != nil {
			return err
		}
		if len(blob) != 8 {
			return fmt.Errorf("%s: user blob is %d bytes, expected 8", a.load, len(blob))
		}
		step = binary.LittleEndian.Uint64(blob)
	} else {
		init := rng{1}
		for k := range w {
			w[k] = float32(0.1 * init.next())
		}
		for i := range b {
			b[i] = float32(0.1 * init.next())
		}
	}

	for it := uint64(0); it < a.steps; it, step = it+1, step+1 {
		var gw [out][in]float64
		var gb [out]float64
		loss := 0.0
		data := rng{step*4096 + uint64(rank)*64 + 1}
		for n := 0; n < batch; n++ {
			var x [in]float64
			for j := range x {
				x[j] = data.next()
			}
			for i := 0; i < out; i++ {
				y, t := float64(b[i]), tb[i]
				for j := 0; j < in; j++ {
					y += float64(float64(w[i*in+j]) * x[j])
					t += float64(tw[i][j] * x[j])
				}
				diff := y - t
				loss += diff * diff / (out * batch)
				d := 2.0 * diff / (out * batch)
				for j := 0; j < in; j++ {
					gw[i][j] += float64(d * x[j])
				}
				gb[i] += d
			}
		}
		for i := 0; i < out; i++ {
			for j := 0; j < in; j++ {
				dw[i*in+j] = float32(gw[i][j])
			}
			db[i] = float32(gb[i])
		}
		if rank == 0 {
			fmt.Printf("step %d loss %.6f bits %016x\n", step, loss, math.Float64bits(loss))
		}
		if _, err := g.Step(nil); err != nil {
			return err
		}
	}

	if a.save != "" {
		blob := make([]byte, 8)
		binary.LittleEndian.PutUint64(blob, step)
		f, err := g.Save(sx.SaveOptions{Path: a.save, UserBlob: blob})
		if err != nil {
			return err
		}
		defer f.Close()
		if err := f.Wait(); err != nil {
			return err
		}
		if rank == 0 {
			fmt.Printf("saved %s\n", a.save)
		}
	}
	return nil
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s [--steps N] [--save DIR] [--load DIR]\n", os.Args[0])
	os.Exit(2)
}

func main() {
	a := &args{steps: 20, rendezvous: fmt.Sprintf("local://linreg-%d", os.Getpid())}
	for i := 1; i < len(os.Args); i += 2 {
		if i+1 >= len(os.Args) {
			usage()
		}
		v := os.Args[i+1]
		switch os.Args[i] {
		case "--steps":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: --steps takes a non-negative integer, not %q\n", os.Args[0], v)
				usage()
			}
			a.steps = n
		case "--save":
			a.save = v
		case "--load":
			a.load = v
		default:
			usage()
		}
	}
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for r := int32(0); r < ranks; r++ {
		wg.Add(1)
		go func(r int32) {
			defer wg.Done()
			errs[r] = runRank(r, a)
		}(r)
	}
	wg.Wait()
	failed := false
	for r, err := range errs {
		if err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: %v\n", r, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}
