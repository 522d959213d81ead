package sx

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// goLion is Lion as sx's built-in computes it (float32, one rounding per operation: each
// product is converted explicitly, which forbids fusing it into an FMA).
func goLion(p *OptimizerPiece) error {
	hp := p.Hyperparameters
	lr, beta1, beta2, wd := hp[0], hp[1], hp[2], hp[3]
	decay := float32(1.0 - float64(lr*wd))
	b1, omb1 := float32(beta1), float32(1.0-beta1)
	b2, omb2 := float32(beta2), float32(1.0-beta2)
	negLR := float32(-lr)
	m := p.State[0]
	for i := range p.Param {
		g := float32(p.Grad[i] * p.GradScale)
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

// Registration is per process: each optimizer is registered once for the test binary.
var (
	lionOnce, lionInPlaceOnce, probeOnce sync.Once
	lionOpt, lionInPlaceOpt, probeOpt    Optimizer
	lionErr, lionInPlaceErr, probeErr    error
	probeMu                              sync.Mutex
	probePieces                          [][3]int64 // offset, n, step
)

func lionDesc(name string) OptimizerDesc {
	return OptimizerDesc{Name: name, Slots: []string{"exp_avg"},
		Hyperparameters: []OptimizerHyperparameter{{Name: "lr", Default: 1e-4}, {Name: "beta1", Default: 0.9},
			{Name: "beta2", Default: 0.99}, {Name: "weight_decay"}},
		Update: goLion}
}

func testLion(t *testing.T) Optimizer {
	lionOnce.Do(func() { lionOpt, lionErr = RegisterOptimizer(lionDesc("go_test_lion")) })
	if lionErr != nil {
		t.Fatal(lionErr)
	}
	return lionOpt
}

// testLionInPlace is the same Lion updating in place (SX_OPTIMIZER_IN_PLACE).
func testLionInPlace(t *testing.T) Optimizer {
	lionInPlaceOnce.Do(func() {
		d := lionDesc("go_test_lion_in_place")
		d.InPlace = true
		lionInPlaceOpt, lionInPlaceErr = RegisterOptimizer(d)
	})
	if lionInPlaceErr != nil {
		t.Fatal(lionInPlaceErr)
	}
	return lionInPlaceOpt
}

// A plain SGD scaled by an own "scale" (CustomHyperparameter(0)), a slot starting at 1.5
// that counts updates, and an own "mode" (CustomHyperparameter(1)): 1 fails with 7, 2
// panics. Records every piece.
func testProbe(t *testing.T) Optimizer {
	probeOnce.Do(func() {
		probeOpt, probeErr = RegisterOptimizer(OptimizerDesc{Name: "go_test_probe", Slots: []string{"count"},
			SlotInitialValues: []float32{1.5},
			Hyperparameters: []OptimizerHyperparameter{{Name: "lr", Default: 0.1},
				{Name: "scale", Default: 2, Min: 0, Max: 10}, {Name: "mode"}},
			Update: func(p *OptimizerPiece) error {
				probeMu.Lock()
				probePieces = append(probePieces, [3]int64{int64(p.Offset), int64(len(p.Param)), p.Step})
				probeMu.Unlock()
				lr, scale := float32(p.Hyperparameters[0]), float32(p.Hyperparameters[1])
				for i := range p.Param {
					p.Param[i] -= float32(lr*scale) * float32(p.Grad[i]*p.GradScale)
					p.State[0][i]++
				}
				switch p.Hyperparameters[2] {
				case 1:
					return UpdateFailure(7)
				case 2:
					panic("the probe was told to panic")
				}
				return nil
			}})
	})
	if probeErr != nil {
		t.Fatal(probeErr)
	}
	return probeOpt
}

func lionGrad(step, k int, rank int32) float32 {
	return float32(math.Sin(float64(k)*0.37+float64(step)*1.3+float64(rank)*0.5) * float64(1+step%3))
}

// testLionTwins holds every param twice in one group, under the built-in Lion and under
// goLion (custom, registered in place or not), with the same values and gradients; after
// 20 steps both copies hold the same bits. An in-place optimizer's unit holds one exp_avg
// buffer, as the built-in's does; a double-buffered one holds more.
func testLionTwins(t *testing.T, world int32, custom Optimizer, inPlace bool) {
	if custom < OptimCustomFirst || !custom.IsCustom() || Lion.IsCustom() {
		t.Fatalf("RegisterOptimizer gave %d", custom)
	}
	runRanks(t, fmt.Sprintf("custom-lion-%d-%v", world, inPlace), world, func(rank int32, g *ShardGroup) error {
		var groups [2]int32
		for k, opt := range []Optimizer{Lion, custom} {
			pg := NewParamGroup(opt)
			if opt == custom && (pg.LR != 1e-4 || pg.Beta1 != 0.9 || pg.Beta2 != 0.99) {
				return fmt.Errorf("the custom Lion's defaults: %+v", pg)
			}
			pg.LR, pg.Beta1, pg.Beta2, pg.WeightDecay = 3e-3, 0.8, 0.95, 0.1
			var err error
			if groups[k], err = g.AddParamGroup(pg); err != nil {
				return err
			}
		}
		var pairs [][2]int32
		for k, shape := range [][]int64{{37, 53}, {7}} {
			var pair [2]int32
			for j, suffix := range []string{"builtin", "custom"} {
				var err error
				pair[j], err = g.AddParam(Param{Name: fmt.Sprintf("p%d.%s", k, suffix), Shape: shape,
					ParamGroup: groups[j], Unit: int32(j)})
				if err != nil {
					return err
				}
			}
			pairs = append(pairs, pair)
		}
		if err := g.Finalize(); err != nil {
			return err
		}
		for _, pair := range pairs {
			for _, i := range pair {
				w, err := g.Param(i)
				if err != nil {
					return err
				}
				for k := range w {
					w[k] = float32(math.Cos(float64(k)))
				}
			}
		}
		for s := 0; s < 20; s++ {
			if s == 10 {
				for _, pg := range groups {
					if err := g.SetLR(pg, 1e-3); err != nil {
						return err
					}
				}
			}
			for _, pair := range pairs {
				for _, i := range pair {
					dw, err := g.Grad(i)
					if err != nil {
						return err
					}
					for k := range dw {
						dw[k] = lionGrad(s, k, rank)
					}
				}
			}
			if _, err := g.Step(&StepOptions{MaxGradNorm: 5}); err != nil {
				return err
			}
		}
		for _, pair := range pairs {
			a, _ := g.Param(pair[0])
			b, _ := g.Param(pair[1])
			changed, differ := 0, 0
			for k := range a {
				if a[k] != float32(math.Cos(float64(k))) {
					changed++
				}
				if math.Float32bits(a[k]) != math.Float32bits(b[k]) {
					differ++
				}
			}
			if changed == 0 || differ != 0 {
				return fmt.Errorf("param %d: %d of %d values changed, %d differ from the built-in Lion",
					pair[1], changed, len(a), differ)
			}
			ia, _ := g.ParamInfo(pair[0])
			ib, _ := g.ParamInfo(pair[1])
			if ia.ShardBegin == ib.ShardBegin && ia.ShardEnd == ib.ShardEnd && ib.ShardEnd > ib.ShardBegin {
				ma, err := g.State(pair[0], "exp_avg")
				if err != nil {
					return err
				}
				mb, err := g.State(pair[1], "exp_avg")
				if err != nil {
					return err
				}
				for k := range ma {
					if math.Float32bits(ma[k]) != math.Float32bits(mb[k]) {
						return fmt.Errorf("param %d: exp_avg[%d] %g, the built-in's %g", pair[1], k, mb[k], ma[k])
					}
				}
			}
		}
		// The state bytes: fp32 params (no masters), one exp_avg per unit when in place.
		var oneSlot uint64
		for u := int32(0); u < 2; u++ {
			info, err := g.UnitInfo(u)
			if err != nil {
				return err
			}
			oneSlot += info.ShardNumel * 4
		}
		stats, err := g.MemoryStats()
		if err != nil {
			return err
		}
		if inPlace && stats.OptimizerBytes != oneSlot {
			return fmt.Errorf("in place: %d optimizer bytes, %d in one exp_avg per unit", stats.OptimizerBytes, oneSlot)
		}
		if !inPlace && stats.OptimizerBytes <= oneSlot {
			return fmt.Errorf("double-buffered: %d optimizer bytes, no more than one exp_avg per unit", stats.OptimizerBytes)
		}
		return nil
	})
}

func TestCustomLionMatchesBuiltinOneRank(t *testing.T)  { testLionTwins(t, 1, testLion(t), false) }
func TestCustomLionMatchesBuiltinTwoRanks(t *testing.T) { testLionTwins(t, 2, testLion(t), false) }

func TestCustomLionInPlaceMatchesBuiltinTwoRanks(t *testing.T) {
	inPlace := testLionInPlace(t)
	if inPlace == testLion(t) {
		t.Fatalf("the in-place Lion got the same id as the other: %d", inPlace)
	}
	testLionTwins(t, 2, inPlace, true)
}

func TestCustomOptimizerHyperparametersSlotsAndFailures(t *testing.T) {
	probe := testProbe(t)
	probeMu.Lock()
	probePieces = nil
	probeMu.Unlock()
	const numel = 37 * 53
	runRanks(t, "custom-probe", 2, func(rank int32, g *ShardGroup) error {
		pg, err := g.AddParamGroup(NewParamGroup(probe))
		if err != nil {
			return err
		}
		if v, err := g.GetHyperparameter(pg, CustomHyperparameter(0)); err != nil || v != 2 {
			return fmt.Errorf("scale %g, %v", v, err)
		}
		if err := g.SetHyperparameter(pg, CustomHyperparameter(0), 3); err != nil {
			return err
		}
		if err := g.SetHyperparameter(pg, CustomHyperparameter(0), 11); statusOf(err) != ErrInvalidArgument {
			return fmt.Errorf("a scale outside [0, 10] gave %v", err)
		}
		w, err := g.AddParam(Param{Name: "w", Shape: []int64{37, 53}, ParamGroup: pg})
		if err != nil {
			return err
		}
		if err := g.Finalize(); err != nil {
			return err
		}
		fillGrad := func() error {
			dw, err := g.Grad(w)
			for k := range dw {
				dw[k] = 1
			}
			return err
		}
		if err := fillGrad(); err != nil {
			return err
		}
		if _, err := g.Step(nil); err != nil {
			return err
		}
		values, _ := g.Param(w)
		after := append([]float32(nil), values...)
		for k, v := range after {
			if math.Abs(float64(v)+0.3) > 1e-6 {
				return fmt.Errorf("w[%d] = %g after one step, want -0.3", k, v)
			}
		}
		counts, err := g.State(w, "count")
		if err != nil {
			return err
		}
		for k, c := range counts {
			if c != 2.5 {
				return fmt.Errorf("count[%d] = %g, want 2.5 (1.5, then one update)", k, c)
			}
		}
		// A failing or panicking update fails the step on every rank and changes nothing.
		for _, mode := range []float64{1, 2} {
			if err := g.SetHyperparameter(pg, CustomHyperparameter(1), mode); err != nil {
				return err
			}
			if err := fillGrad(); err != nil {
				return err
			}
			_, err := g.Step(nil)
			if statusOf(err) != ErrOptimizer || !strings.Contains(err.Error(), "go_test_probe") {
				return fmt.Errorf("mode %g: Step gave %v", mode, err)
			}
			now, _ := g.Param(w)
			for k := range now {
				if now[k] != after[k] {
					return fmt.Errorf("mode %g: a failed step changed w[%d]", mode, k)
				}
			}
			for k := range counts {
				if counts[k] != 2.5 {
					return fmt.Errorf("mode %g: a failed step changed count[%d]", mode, k)
				}
			}
		}
		return nil
	})
	var uf UpdateFailure
	if err := probe.LastUpdateFailure(); err == nil || errors.As(err, &uf) || !strings.Contains(err.Error(), "panic") {
		t.Errorf("LastUpdateFailure after a panic: %v", err)
	}
	// The first step's pieces cover the param once, over both ranks' shards.
	probeMu.Lock()
	defer probeMu.Unlock()
	covered := map[int64]int64{}
	for _, p := range probePieces {
		if p[2] == 1 {
			if p[1] < 1 {
				t.Errorf("a piece of %d elements", p[1])
			}
			covered[p[0]] += p[1]
		}
	}
	var total int64
	for _, n := range covered {
		total += n
	}
	if total != numel {
		t.Errorf("the first step's pieces cover %d elements of %d", total, numel)
	}
}

// errMessageTest is what go_test_error_message's update returns in mode 1.
var errMessageTest = errors.New("the message test's update failed on purpose")

// A failing update's words reach Step's ErrOptimizer message (sx_last_error_message):
// an error's Error() text, an UpdateFailure's, a panic's value, and an error longer than
// sx's buffer, cut at a character boundary.
func TestCustomOptimizerErrorMessage(t *testing.T) {
	opt, err := RegisterOptimizer(OptimizerDesc{Name: "go_test_error_message",
		Hyperparameters: []OptimizerHyperparameter{{Name: "mode"}},
		Update: func(p *OptimizerPiece) error {
			switch p.Hyperparameters[0] {
			case 1:
				return errMessageTest
			case 2:
				return UpdateFailure(9)
			case 3:
				panic("the message test's update panicked on purpose")
			case 4:
				return errors.New(strings.Repeat("\u00e9", 300)) // 2-byte characters
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	// OptimizerErrorBytes holds the NUL too: an odd number of bytes for the 2-byte
	// characters, so the cut falls inside one and the whole ones before it are kept.
	long := ": " + strings.Repeat("\u00e9", (OptimizerErrorBytes-1)/2) + ": the step"
	for _, world := range []int32{1, 2} {
		runRanks(t, fmt.Sprintf("custom-message-%d", world), world, func(rank int32, g *ShardGroup) error {
			pg, err := g.AddParamGroup(NewParamGroup(opt))
			if err != nil {
				return err
			}
			if _, err := g.AddParam(Param{Name: "w", Shape: []int64{4, 8}, ParamGroup: pg}); err != nil {
				return err
			}
			if err := g.Finalize(); err != nil {
				return err
			}
			if _, err := g.Step(nil); err != nil { // mode 0 succeeds
				return err
			}
			// sx's message: "... updating param 'w' on rank R: <the update's words>: the step ...".
			for _, c := range []struct {
				mode float64
				text string
			}{
				{1, ": the message test's update failed on purpose: "},
				{2, ": custom optimizer update failed with 9: "},
				{3, ": the update panicked: the message test's update panicked on purpose: "},
				{4, long},
			} {
				if err := g.SetHyperparameter(pg, CustomHyperparameter(0), c.mode); err != nil {
					return err
				}
				_, err := g.Step(nil)
				var e *Error
				if !errors.As(err, &e) || e.Status != ErrOptimizer {
					return fmt.Errorf("mode %g: Step gave %v", c.mode, err)
				}
				if !strings.Contains(e.Message, "go_test_error_message") || !strings.Contains(e.Message, c.text) ||
					!utf8.ValidString(e.Message) {
					return fmt.Errorf("mode %g: the message %q lacks %q", c.mode, e.Message, c.text)
				}
			}
			return nil
		})
	}
	// LastUpdateFailure still has the update's own error (the last one: mode 4's).
	if err := opt.LastUpdateFailure(); err == nil || !strings.HasPrefix(err.Error(), "\u00e9\u00e9") {
		t.Errorf("LastUpdateFailure: %v", err)
	}
}

func TestCustomOptimizerBadDescriptions(t *testing.T) {
	lion := testLion(t)
	for _, c := range []struct {
		what   string
		desc   OptimizerDesc
		status int32
		words  string
	}{
		{"no update", OptimizerDesc{Name: "go_bad_update", Slots: []string{"m"}}, ErrInvalidArgument, "update"},
		{"a repeated slot", OptimizerDesc{Name: "go_bad_slots", Slots: []string{"m", "m"}, Update: goLion},
			ErrInvalidArgument, "m"},
		{"too many slots", OptimizerDesc{Name: "go_bad_many", Slots: []string{"a", "b", "c", "d"}, Update: goLion},
			ErrInvalidArgument, ""},
		{"a bad name", OptimizerDesc{Name: "bad name!", Update: goLion}, ErrInvalidArgument, ""},
		{"a default outside its range", OptimizerDesc{Name: "go_bad_range", Update: goLion,
			Hyperparameters: []OptimizerHyperparameter{{Name: "k", Default: 5, Min: 0, Max: 1}}}, ErrInvalidArgument, ""},
		{"a NUL", OptimizerDesc{Name: "go\x00bad", Update: goLion}, ErrInvalidArgument, "NUL"},
		{"initial values of another count", OptimizerDesc{Name: "go_bad_init", Slots: []string{"a"},
			SlotInitialValues: []float32{1, 2}, Update: goLion}, ErrInvalidArgument, "SlotInitialValues"},
		{"a taken name", OptimizerDesc{Name: "go_test_lion", Slots: []string{"exp_avg"}, Update: goLion},
			ErrAlreadyExists, ""},
	} {
		opt, err := RegisterOptimizer(c.desc)
		if statusOf(err) != c.status || !strings.Contains(err.Error(), c.words) {
			t.Errorf("%s: RegisterOptimizer gave %d, %v", c.what, opt, err)
		}
	}
	if !lion.IsCustom() {
		t.Error("the registered Lion was lost")
	}
}
