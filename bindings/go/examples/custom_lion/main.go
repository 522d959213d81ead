// Command custom_lion defines Lion in Go as an sx custom optimizer and checks it against
// sx's built-in Lion (sx.Lion, SX_OPTIM_LION) bit for bit over 20 steps of a tiny model,
// on a world of 1 and of 2 ranks (goroutines of this process over local://).
//
// Every param is registered twice in one group: once under the built-in Lion, once under
// this one, with the same initial values and the same gradients at every step; after the
// steps both copies must hold the same bits.
//
//	cd bindings/go && go run ./examples/custom_lion
//
// (with PKG_CONFIG_PATH naming the build tree, whose sx.pc has an rpath: see the binding's README).
package main

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"

	sx "github.com/sx-runtime/sx/bindings/go"
)

// lion is Lion as sx's built-in computes it: float32 arithmetic, one rounding per
// operation. The explicit float32(...) conversions around each product forbid the
// compiler to fuse it with the following addition (the Go spec allows x*y + z to be
// computed with one rounding, an FMA, unless the product is converted explicitly). The
// hyperparameters are in the order they were registered: lr, beta1, beta2, weight_decay.
func lion(p *sx.OptimizerPiece) error {
	hp := p.Hyperparameters
	lr, beta1, beta2, wd := hp[0], hp[1], hp[2], hp[3]
	decay := float32(1.0 - float64(lr*wd))
	b1, omb1 := float32(beta1), float32(1.0-beta1)
	b2, omb2 := float32(beta2), float32(1.0-beta2)
	negLR := float32(-lr)
	scale := p.GradScale
	m := p.State[0]
	for i := range p.Param {
		g := float32(p.Grad[i] * scale)
		x := float32(p.Param[i] * decay)
		c := float32(m[i]*b1) + float32(omb1*g)
		var u float32
		if c > 0 {
			u = 1
		} else if c < 0 {
			u = -1
		}
		p.Param[i] = x + float32(negLR*u)
		m[i] = float32(m[i]*b2) + float32(omb2*g)
	}
	return nil
}

var shapes = [][]int64{{37, 53}, {7}}

const steps = 20

func gradAt(step, k int, rank int32) float32 {
	return float32(math.Sin(float64(k)*0.37+float64(step)*1.3+float64(rank)*0.5) * float64(1+step%3))
}

// rankMain trains one rank and returns, per param, the built-in copy and the custom one.
func rankMain(rank, world int32, rendezvous string, custom sx.Optimizer) ([][2][]float32, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	g, err := sx.NewShardGroup(sx.GroupConfig{Rendezvous: rendezvous, Rank: rank, WorldSize: world,
		Backend: sx.BackendCPU, NumThreads: 2, TimeoutMs: 60000})
	if err != nil {
		return nil, err
	}
	defer g.Close()
	var groups [2]int32
	for k, opt := range []sx.Optimizer{sx.Lion, custom} {
		pg := sx.NewParamGroup(opt)
		pg.LR, pg.Beta1, pg.Beta2, pg.WeightDecay = 3e-3, 0.8, 0.95, 0.1
		if groups[k], err = g.AddParamGroup(pg); err != nil {
			return nil, err
		}
	}
	var pairs [][2]int32
	for k, shape := range shapes {
		var pair [2]int32
		for j, suffix := range []string{"builtin", "custom"} {
			pair[j], err = g.AddParam(sx.Param{Name: fmt.Sprintf("p%d.%s", k, suffix), Shape: shape,
				ParamGroup: groups[j], Unit: int32(j)})
			if err != nil {
				return nil, err
			}
		}
		pairs = append(pairs, pair)
	}
	if err := g.Finalize(); err != nil {
		return nil, err
	}
	for _, pair := range pairs {
		for _, i := range pair {
			w, err := g.Param(i)
			if err != nil {
				return nil, err
			}
			for k := range w {
				w[k] = float32(math.Cos(float64(k)))
			}
		}
	}
	for s := 0; s < steps; s++ {
		if s == 10 {
			for _, pg := range groups {
				if err := g.SetLR(pg, 1e-3); err != nil {
					return nil, err
				}
			}
		}
		for _, pair := range pairs {
			for _, i := range pair {
				dw, err := g.Grad(i)
				if err != nil {
					return nil, err
				}
				for k := range dw {
					dw[k] = gradAt(s, k, rank)
				}
			}
		}
		if _, err := g.Step(&sx.StepOptions{MaxGradNorm: 5}); err != nil {
			return nil, err
		}
	}
	var out [][2][]float32
	for _, pair := range pairs {
		var values [2][]float32
		for j, i := range pair {
			w, err := g.Param(i)
			if err != nil {
				return nil, err
			}
			values[j] = append([]float32(nil), w...)
		}
		out = append(out, values)
	}
	return out, nil
}

func run(world int32, custom sx.Optimizer) error {
	rendezvous := fmt.Sprintf("local://go-custom-lion-%d-%d", os.Getpid(), world)
	results := make([][][2][]float32, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := int32(0); r < world; r++ {
		wg.Add(1)
		go func(rank int32) {
			defer wg.Done()
			results[rank], errs[rank] = rankMain(rank, world, rendezvous, custom)
		}(r)
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			return fmt.Errorf("world %d, rank %d: %w", world, rank, err)
		}
	}
	for rank, params := range results {
		for k, pair := range params {
			differ := 0
			for i := range pair[0] {
				if math.Float32bits(pair[0][i]) != math.Float32bits(pair[1][i]) {
					differ++
				}
			}
			if differ > 0 {
				return fmt.Errorf("world %d, rank %d, param %d: %d of %d values differ from the built-in Lion",
					world, rank, k, differ, len(pair[0]))
			}
			if rank == 0 {
				fmt.Printf("world %d: param %d (%d values) identical to the built-in Lion after %d steps\n",
					world, k, len(pair[0]), steps)
			}
		}
	}
	return nil
}

func main() {
	custom, err := sx.RegisterOptimizer(sx.OptimizerDesc{
		Name:  "go_lion",
		Slots: []string{"exp_avg"},
		Hyperparameters: []sx.OptimizerHyperparameter{
			{Name: "lr", Default: 1e-4}, {Name: "beta1", Default: 0.9}, {Name: "beta2", Default: 0.99},
			{Name: "weight_decay", Default: 0},
		},
		Update: lion,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "RegisterOptimizer:", err)
		os.Exit(1)
	}
	for _, world := range []int32{1, 2} {
		if err := run(world, custom); err != nil {
			fmt.Fprintln(os.Stderr, "custom_lion:", err)
			os.Exit(1)
		}
	}
	fmt.Println("custom_lion: the Go Lion matches sx's built-in Lion bit for bit")
}
