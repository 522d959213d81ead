package sx

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// wholeSetup: AdamW with amsgrad (w and the scalar s), SGD with momentum (b) and NAdam
// (n), in two units.
func wholeSetup(g *ShardGroup) error {
	adamw := NewParamGroup(AdamW)
	adamw.LR, adamw.Amsgrad = 0.01, true
	sgd := NewParamGroup(SGD)
	sgd.LR, sgd.Momentum = 0.1, 0.9
	nadam := NewParamGroup(NAdam)
	nadam.LR = 0.01
	for _, pg := range []ParamGroup{adamw, sgd, nadam} {
		if _, err := g.AddParamGroup(pg); err != nil {
			return err
		}
	}
	for _, p := range []Param{{Name: "w", Shape: []int64{7, 11}, ParamGroup: 0, Unit: 0},
		{Name: "b", Shape: []int64{13}, ParamGroup: 1, Unit: 1}, {Name: "s", ParamGroup: 0, Unit: 1},
		{Name: "n", Shape: []int64{5}, ParamGroup: 2, Unit: 1}} {
		if _, err := g.AddParam(p); err != nil {
			return err
		}
	}
	return g.Finalize()
}

// wholeTrain takes steps with gradients that differ per rank (seed), step and param.
func wholeTrain(g *ShardGroup, steps, seed int) error {
	n, err := g.NumParams()
	if err != nil {
		return err
	}
	for s := 0; s < steps; s++ {
		for i := int32(0); i < n; i++ {
			grad, err := g.Grad(i)
			if err != nil {
				return err
			}
			for k := range grad {
				grad[k] = float32((k*7+s*3+seed+int(i))%11-5) / 8
			}
		}
		if _, err := g.Step(&StepOptions{MaxGradNorm: 2}); err != nil {
			return err
		}
	}
	return nil
}

// wholeParams is the number of params wholeSetup adds.
const wholeParams = 4

func byName(states []ParamState) map[string]ParamState {
	m := map[string]ParamState{}
	for _, s := range states {
		m[s.Name] = s
	}
	return m
}

func tensorNames(s ParamState) string {
	var names []string
	for n := range s.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

func TestWholeStateRoundTripFromThreeRanksToTwo(t *testing.T) {
	var states []ParamState
	var others [3]bool
	values := make([][]float32, wholeParams)
	runRanks(t, "whole-save3", 3, func(rank int32, g *ShardGroup) error {
		if err := wholeSetup(g); err != nil {
			return err
		}
		if err := wholeTrain(g, 3, int(rank)); err != nil {
			return err
		}
		all, err := g.GatherOptimState(0)
		if err != nil {
			return err
		}
		if rank == 0 {
			states = all
			for i := int32(0); i < wholeParams; i++ {
				p, err := g.Param(i)
				if err != nil {
					return err
				}
				values[i] = append([]float32{}, p...)
			}
		} else {
			others[rank] = all != nil
		}
		return nil
	})
	if others[1] || others[2] {
		t.Fatalf("a rank other than the root got states")
	}
	if len(states) != wholeParams || states[0].Name != "w" || states[1].Name != "b" || states[2].Name != "s" ||
		states[3].Name != "n" {
		t.Fatalf("the gathered params: %+v", states)
	}
	if got := tensorNames(states[0]); got != "exp_avg,exp_avg_sq,max_exp_avg_sq" {
		t.Errorf("w's tensors: %s", got)
	}
	if got := tensorNames(states[1]); got != "momentum_buffer" {
		t.Errorf("b's tensors: %s", got)
	}
	if got := tensorNames(states[3]); got != "exp_avg,exp_avg_sq" {
		t.Errorf("n's tensors: %s", got)
	}
	// NAdam's mu_product after 3 steps: a product of coefficients below 1; 0 elsewhere.
	if mu := states[3].MuProduct; !(mu > 0 && mu < 1) {
		t.Errorf("n's mu_product: %v", mu)
	}
	for _, s := range states[:3] {
		if s.MuProduct != 0 {
			t.Errorf("%s's mu_product: %v", s.Name, s.MuProduct)
		}
	}
	if states[0].Step != 3 || states[1].MomentumSteps != 3 || states[1].ParamGroup != 1 || states[0].Numel != 77 {
		t.Errorf("step counts, group or numel: %+v %+v", states[0].Step, states[1])
	}
	nonzero := false
	for _, x := range states[0].Tensors["exp_avg"] {
		nonzero = nonzero || x != 0
	}
	if !nonzero {
		t.Errorf("w's exp_avg is zero after 3 steps")
	}

	// A mu_product other than the one sx would derive from the step, so that the scatter
	// shows it was carried (a float32 value, which comes back exactly).
	states[3].MuProduct = 0.5

	var back []ParamState
	runRanks(t, "whole-load2", 2, func(rank int32, g *ShardGroup) error {
		if err := wholeSetup(g); err != nil {
			return err
		}
		for i, v := range values {
			p, err := g.Param(int32(i))
			if err != nil {
				return err
			}
			copy(p, v)
		}
		var given map[string]ParamState
		if rank == 1 {
			given = byName(states)
		}
		if err := g.ScatterOptimState(1, given); err != nil {
			return err
		}
		// This rank's part, in place, is the slice of the whole that its shard covers.
		for _, c := range []struct {
			param  int32
			tensor string
		}{{0, "exp_avg"}, {0, "max_exp_avg_sq"}, {1, "momentum_buffer"}} {
			info, err := g.ParamInfo(c.param)
			if err != nil {
				return err
			}
			part, err := g.State(c.param, c.tensor)
			if err != nil {
				return err
			}
			want := states[c.param].Tensors[c.tensor][info.ShardBegin:info.ShardEnd]
			if !reflect.DeepEqual(part, want) {
				return fmt.Errorf("param %d's %s here: %v, the gathered slice: %v", c.param, c.tensor, part, want)
			}
		}
		all, err := g.GatherOptimState(0)
		if err != nil {
			return err
		}
		if rank == 0 {
			back = all
		}
		return wholeTrain(g, 1, int(rank)) // the scattered state steps on
	})
	if !reflect.DeepEqual(back, states) {
		t.Errorf("the state came back changed:\n%+v\n%+v", back, states)
	}
}

func TestWholeStateCallbacksTheirErrorsAndPanics(t *testing.T) {
	runRanks(t, "whole-callback", 2, func(rank int32, g *ShardGroup) error {
		if err := wholeSetup(g); err != nil {
			return err
		}
		if err := wholeTrain(g, 2, int(rank)); err != nil {
			return err
		}
		var seen []string
		var fn func(*ParamState) error
		if rank == 1 {
			fn = func(st *ParamState) error {
				for name, values := range st.Tensors {
					if uint64(len(values)) != st.Numel {
						return fmt.Errorf("%s's %s has %d values, numel %d", st.Name, name, len(values), st.Numel)
					}
				}
				seen = append(seen, fmt.Sprintf("%s/%d/%s", st.Name, st.ParamGroup, tensorNames(*st)))
				return nil
			}
		}
		if err := g.GatherOptimStateFunc(1, fn); err != nil {
			return err
		}
		want := []string{"w/0/exp_avg,exp_avg_sq,max_exp_avg_sq", "b/1/momentum_buffer", "s/0/exp_avg,exp_avg_sq,max_exp_avg_sq",
			"n/2/exp_avg,exp_avg_sq"}
		if rank == 1 && !reflect.DeepEqual(seen, want) {
			return fmt.Errorf("the callback saw %v", seen)
		}
		before, err := g.GatherOptimState(0)
		if err != nil {
			return err
		}
		same := func(what string) error {
			after, err := g.GatherOptimState(0)
			if err != nil {
				return err
			}
			if !reflect.DeepEqual(after, before) {
				return fmt.Errorf("%s changed the state", what)
			}
			return nil
		}

		// An error of the root's callback: the root gets it back, the other rank its status.
		err = g.ScatterOptimStateFunc(0, func(st *ParamState) error {
			if st.Name == "b" {
				return &Error{Status: ErrNotFound, Message: "no state for b here"}
			}
			for _, values := range st.Tensors {
				for k := range values {
					values[k] = 1
				}
			}
			st.Step = 99
			return nil
		})
		if statusOf(err) != ErrNotFound {
			return fmt.Errorf("a failing callback gave %v", err)
		}
		if rank == 0 && err.(*Error).Message != "no state for b here" {
			return fmt.Errorf("the root got %v, not its callback's error", err)
		}
		if rank == 1 && (!strings.Contains(err.Error(), "rank 0") || !strings.Contains(err.Error(), "'b'")) {
			return fmt.Errorf("the other rank got %v", err)
		}
		if err := same("a failed scatter"); err != nil {
			return err
		}

		// A plain Go error: ErrCancelled on the other rank.
		err = g.ScatterOptimStateFunc(0, func(st *ParamState) error { return fmt.Errorf("not today") })
		if rank == 0 && (err == nil || err.Error() != "not today") {
			return fmt.Errorf("the root got %v", err)
		}
		if rank == 1 && statusOf(err) != ErrCancelled {
			return fmt.Errorf("the other rank got %v", err)
		}

		// A panic: raised again on the root once sx has returned, ErrCancelled elsewhere.
		if rank == 0 {
			recovered := func() (p interface{}) {
				defer func() { p = recover() }()
				g.ScatterOptimStateFunc(0, func(st *ParamState) error {
					if st.Param == 1 {
						panic("boom in the callback")
					}
					return nil
				})
				return nil
			}()
			if recovered != "boom in the callback" {
				return fmt.Errorf("the callback's panic came back as %v", recovered)
			}
		} else if err := g.ScatterOptimStateFunc(0, nil); statusOf(err) != ErrCancelled {
			return fmt.Errorf("a scatter whose callback panicked gave %v", err)
		}
		if err := same("a scatter whose callback panicked"); err != nil {
			return err
		}
		return wholeTrain(g, 1, int(rank)) // the group goes on
	})
}

func TestScatterMapMustFitAndMissingParamsAreZeroState(t *testing.T) {
	runRanks(t, "whole-map", 2, func(rank int32, g *ShardGroup) error {
		if err := wholeSetup(g); err != nil {
			return err
		}
		if err := wholeTrain(g, 1, int(rank)); err != nil {
			return err
		}
		all, err := g.GatherOptimState(0)
		if err != nil {
			return err
		}
		var given map[string]ParamState
		if rank == 0 {
			given = byName(all)
			w := given["w"]
			w.Tensors["exp_avg"] = w.Tensors["exp_avg"][:76]
		}
		err = g.ScatterOptimState(0, given)
		if statusOf(err) != ErrInvalidArgument ||
			(rank == 0 && !strings.Contains(err.Error(), "'exp_avg' has 76 values; sx keeps 77")) {
			return fmt.Errorf("a short tensor gave %v", err)
		}
		if rank == 0 {
			delete(given, "w")
		}
		// Nothing on the root: every rank is told, none waits for the others in vain.
		if err := g.ScatterOptimState(0, nil); statusOf(err) != ErrInvalidArgument ||
			(rank == 0 && !strings.Contains(err.Error(), "no callback or states were given on the root")) {
			return fmt.Errorf("a scatter without states on the root gave %v", err)
		}
		if err := g.GatherOptimStateFunc(0, nil); statusOf(err) != ErrInvalidArgument {
			return fmt.Errorf("a gather without a callback on the root gave %v", err)
		}
		if err := g.ScatterOptimState(0, given); err != nil {
			return err
		}
		back, err := g.GatherOptimState(0)
		if err != nil || rank != 0 {
			return err
		}
		if back[0].Step != 0 {
			return fmt.Errorf("w's step is %d", back[0].Step)
		}
		for name, values := range back[0].Tensors {
			for _, x := range values {
				if x != 0 {
					return fmt.Errorf("w's %s is not zero", name)
				}
			}
		}
		if !reflect.DeepEqual(back[1], given["b"]) {
			return fmt.Errorf("b came back as %+v", back[1])
		}
		return nil
	})
}

// adafactorSetup: Adafactor's factored moments for [6, 5] and [2, 3, 4] (rows split
// between ranks), a variance per element for [7].
func adafactorSetup(g *ShardGroup) error {
	pg := NewParamGroup(Adafactor)
	pg.LR = 0.01
	if _, err := g.AddParamGroup(pg); err != nil {
		return err
	}
	for _, p := range []Param{{Name: "m", Shape: []int64{6, 5}, Unit: 0}, {Name: "t", Shape: []int64{2, 3, 4}, Unit: 0},
		{Name: "v", Shape: []int64{7}, Unit: 1}} {
		if _, err := g.AddParam(p); err != nil {
			return err
		}
	}
	return g.Finalize()
}

func TestAdafactorFactoredMomentsHaveTheirOwnLengths(t *testing.T) {
	var states []ParamState
	var seen []string
	runRanks(t, "whole-adafactor3", 3, func(rank int32, g *ShardGroup) error {
		if err := adafactorSetup(g); err != nil {
			return err
		}
		if err := wholeTrain(g, 3, int(rank)); err != nil {
			return err
		}
		err := g.GatherOptimStateFunc(0, func(st *ParamState) error {
			for name, values := range st.Tensors {
				seen = append(seen, fmt.Sprintf("%s.%s:%d", st.Name, name, len(values)))
			}
			return nil
		})
		if err != nil {
			return err
		}
		all, err := g.GatherOptimState(0)
		if rank == 0 {
			states = all
		}
		return err
	})
	// torch's row_var [..., R, 1] and col_var [..., 1, C], flat.
	sort.Strings(seen)
	if got, want := strings.Join(seen, " "), "m.col_var:5 m.row_var:6 t.col_var:8 t.row_var:6 v.variance:7"; got != want {
		t.Fatalf("the tensors' lengths: %s, want %s", got, want)
	}

	// Scattered into 2 ranks, whole on each: it comes back the same, and a row_var of the
	// param's numel is refused.
	var back []ParamState
	runRanks(t, "whole-adafactor2", 2, func(rank int32, g *ShardGroup) error {
		if err := adafactorSetup(g); err != nil {
			return err
		}
		var wrong, given map[string]ParamState
		if rank == 1 {
			given, wrong = byName(states), byName(states)
			m := wrong["m"]
			m.Tensors = map[string][]float32{"row_var": make([]float32, 30), "col_var": m.Tensors["col_var"]}
			wrong["m"] = m
		}
		if err := g.ScatterOptimState(1, wrong); statusOf(err) != ErrInvalidArgument ||
			(rank == 1 && !strings.Contains(err.Error(), "'row_var' has 30 values; sx keeps 6")) {
			return fmt.Errorf("a row_var of the param's numel gave %v", err)
		}
		if err := g.ScatterOptimState(1, given); err != nil {
			return err
		}
		all, err := g.GatherOptimState(0)
		if err != nil {
			return err
		}
		if rank == 0 {
			back = all
		}
		return wholeTrain(g, 1, int(rank))
	})
	if !reflect.DeepEqual(back, states) {
		t.Errorf("the state came back changed:\n%+v\n%+v", back, states)
	}
}

func TestStateViewsAreThisRanksPartAndSeedTheState(t *testing.T) {
	runRanks(t, "whole-views", 2, func(rank int32, g *ShardGroup) error {
		if err := wholeSetup(g); err != nil {
			return err
		}
		if err := wholeTrain(g, 1, int(rank)); err != nil {
			return err
		}
		if _, err := g.State(1, "exp_avg"); statusOf(err) != ErrInvalidArgument ||
			!strings.Contains(err.Error(), "momentum_buffer") {
			return fmt.Errorf("b's exp_avg gave %v", err)
		}
		part, err := g.State(0, "exp_avg")
		if err != nil {
			return err
		}
		for k := range part {
			part[k] = float32(rank + 1)
		}
		info, err := g.ParamInfo(0)
		if err != nil {
			return err
		}
		v, err := g.StateView(0, "exp_avg")
		if err != nil {
			return err
		}
		if v.Numel != info.ShardEnd-info.ShardBegin || v.Numel == 0 || v.Numel == 77 || v.Dtype != DtypeF32 || v.Device != DeviceCPU {
			return fmt.Errorf("the raw view %+v, the shard [%d, %d)", v, info.ShardBegin, info.ShardEnd)
		}
		all, err := g.GatherOptimState(0)
		if err != nil || rank != 0 {
			return err
		}
		m := all[0].Tensors["exp_avg"]
		for k, x := range m {
			want := float32(2)
			if uint64(k) < info.ShardEnd {
				want = 1
			}
			if x != want {
				return fmt.Errorf("w's exp_avg[%d] is %v, seeded %v", k, x, want)
			}
		}
		return nil
	})
	// Views are checked against a closed group where Go can: the call fails.
	g, err := NewShardGroup(config(rendezvous("whole-closed"), 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	g.AddParamGroup(NewParamGroup(Adam))
	g.AddParam(Param{Name: "w", Shape: []int64{4}, Unit: 0})
	g.AddParam(Param{Name: "f", Shape: []int64{3}, Unit: 1, Frozen: true})
	if err := g.Finalize(); err != nil {
		t.Fatal(err)
	}
	if _, err := g.State(1, "exp_avg"); statusOf(err) != ErrInvalidState {
		t.Errorf("a never trainable param's state gave %v", err)
	}
	all, err := g.GatherOptimState(0)
	if err != nil || len(all) != 2 || len(all[1].Tensors) != 0 || len(all[0].Tensors) != 2 {
		t.Errorf("gathered %+v, %v", all, err)
	}
	g.Close()
	if _, err := g.State(0, "exp_avg"); statusOf(err) != ErrInvalidHandle {
		t.Errorf("State after Close gave %v", err)
	}
}

// An 8-bit group's slots are viewed as codes (Uint8s) with their block scales
// ("exp_avg.scale"); a gather decodes them: each block's extreme is its scale times an end
// of the map.
func TestPackedStateViewsAreCodesAndScales(t *testing.T) {
	runRanks(t, "whole-packed", 2, func(rank int32, g *ShardGroup) error {
		adamw := NewParamGroup(AdamW)
		adamw.LR, adamw.StateDtype = 0.01, StateDtype8Bit
		if _, err := g.AddParamGroup(adamw); err != nil {
			return err
		}
		if _, err := g.AddParam(Param{Name: "w", Shape: []int64{64, 128}}); err != nil {
			return err
		}
		if err := g.Finalize(); err != nil {
			return err
		}
		if err := wholeTrain(g, 2, int(rank)); err != nil {
			return err
		}
		info, err := g.ParamInfo(0)
		if err != nil {
			return err
		}
		if _, err := g.State(0, "exp_avg"); statusOf(err) != ErrUnsupported || !strings.Contains(err.Error(), "u8") {
			return fmt.Errorf("State of 8-bit codes gave %v", err)
		}
		v, err := g.StateView(0, "exp_avg")
		if err != nil {
			return err
		}
		codes, err := v.Uint8s()
		if err != nil || uint64(len(codes)) != info.ShardEnd-info.ShardBegin {
			return fmt.Errorf("the codes %d, the shard [%d, %d): %v", len(codes), info.ShardBegin, info.ShardEnd, err)
		}
		scales, err := g.State(0, "exp_avg.scale")
		if err != nil || len(scales) != len(codes)/256 {
			return fmt.Errorf("%d scales for %d codes: %v", len(scales), len(codes), err)
		}
		mine := append([]float32(nil), scales...)
		all, err := g.GatherOptimState(0)
		if err != nil || rank != 0 {
			return err
		}
		// Each block decodes its extreme to exactly its scale times an end of the signed
		// map: 1.0 or its lowest entry.
		lowest := float32(-0.99296874)
		m := all[0].Tensors["exp_avg"]
		for b, s := range mine {
			hi, lo := float32(math.Inf(-1)), float32(math.Inf(1))
			for _, x := range m[b*256 : (b+1)*256] {
				hi, lo = float32(math.Max(float64(hi), float64(x))), float32(math.Min(float64(lo), float64(x)))
			}
			if (hi != s && lo != lowest*s) || s == 0 {
				return fmt.Errorf("block %d: decoded in [%v, %v], scale %v", b, lo, hi, s)
			}
		}
		return nil
	})
}

func TestWeightedStepAveragesOverTheSamples(t *testing.T) {
	// Ranks hold 3, 2 and 0 samples; each adds the sum of its samples' gradients. SGD
	// with lr 1 from zero: the params become minus the mean over the 5 samples.
	samples := [][]float32{{1, 2, 3}, {10, 20}, {}}
	runRanks(t, "weighted", 3, func(rank int32, g *ShardGroup) error {
		sgd := NewParamGroup(SGD)
		sgd.LR = 1
		g.AddParamGroup(sgd)
		g.AddParam(Param{Name: "w", Shape: []int64{4}})
		if err := g.Finalize(); err != nil {
			return err
		}
		sum := float32(0)
		for _, x := range samples[rank] {
			sum += x
		}
		grad, _ := g.Grad(0)
		for k := range grad {
			grad[k] = sum
		}
		weight := float64(len(samples[rank]))
		r, err := g.Step(&StepOptions{Weight: &weight})
		if err != nil || r.Skipped {
			return fmt.Errorf("the weighted step: %+v, %v", r, err)
		}
		w, _ := g.Param(0)
		for _, x := range w {
			if math.Abs(float64(x)+36.0/5) > 1e-5 {
				return fmt.Errorf("w is %v, not -36/5", w)
			}
		}
		kept := append([]float32{}, w...)
		// Nobody has data: the step is skipped and nothing changes.
		zero := 0.0
		if r, err := g.Step(&StepOptions{Weight: &zero}); err != nil || !r.Skipped {
			return fmt.Errorf("a step every rank weighs 0: %+v, %v", r, err)
		}
		if !reflect.DeepEqual(w, kept) {
			return fmt.Errorf("a skipped step changed w")
		}
		return nil
	})
	runRanks(t, "weighted-mismatch", 2, func(rank int32, g *ShardGroup) error {
		g.AddParamGroup(NewParamGroup(SGD))
		g.AddParam(Param{Name: "w", Shape: []int64{4}})
		if err := g.Finalize(); err != nil {
			return err
		}
		o, one := &StepOptions{}, 1.0
		if rank == 0 {
			o.Weight = &one
		}
		if _, err := g.Step(o); statusOf(err) != ErrMismatch || !strings.Contains(err.Error(), "weighted: 1 on rank 0, 0 on rank 1") {
			return fmt.Errorf("ranks that disagree on weighing gave %v", err)
		}
		return nil
	})
}

func TestParamsAddedAfterFinalize(t *testing.T) {
	runRanks(t, "late-params", 2, func(rank int32, g *ShardGroup) error {
		sgd := NewParamGroup(SGD)
		sgd.LR = 1
		g.AddParamGroup(sgd)
		g.AddParam(Param{Name: "w", Shape: []int64{4}, Unit: 0})
		if err := g.Finalize(); err != nil {
			return err
		}
		grad, _ := g.Grad(0)
		for k := range grad {
			grad[k] = 1
		}
		if _, err := g.Step(nil); err != nil {
			return err
		}
		sgd.LR = 0.5
		late, err := g.AddParamGroup(sgd)
		if err != nil {
			return err
		}
		v, err := g.AddParam(Param{Name: "v", Shape: []int64{3}, ParamGroup: late, Unit: 1})
		if err != nil {
			return err
		}
		if _, err := g.Param(v); statusOf(err) != ErrInvalidState {
			return fmt.Errorf("a view of a param not laid out yet gave %v", err)
		}
		if _, err := g.Step(nil); statusOf(err) != ErrInvalidState || !strings.Contains(err.Error(), "call sx_finalize again") {
			return fmt.Errorf("a step before finalize again gave %v", err)
		}
		if err := g.Finalize(); err != nil {
			return err
		}
		grad, _ = g.Grad(v)
		for k := range grad {
			grad[k] = 2
		}
		if _, err := g.Step(nil); err != nil {
			return err
		}
		w, _ := g.Param(0)
		vv, _ := g.Param(v)
		if !reflect.DeepEqual(w, []float32{-1, -1, -1, -1}) || !reflect.DeepEqual(vv, []float32{-1, -1, -1}) {
			return fmt.Errorf("w %v, v %v", w, vv)
		}
		return nil
	})
	runRanks(t, "late-mismatch", 2, func(rank int32, g *ShardGroup) error {
		g.AddParamGroup(NewParamGroup(SGD))
		g.AddParam(Param{Name: "w", Shape: []int64{4}, Unit: 0})
		if err := g.Finalize(); err != nil {
			return err
		}
		g.AddParam(Param{Name: "v", Shape: []int64{4, 4 + int64(rank)}, Unit: 1})
		if err := g.Finalize(); statusOf(err) != ErrMismatch ||
			!strings.Contains(err.Error(), "param 'v' shape: [4, 4] on rank 0, [4, 5] on rank 1") {
			return fmt.Errorf("ranks that added different params gave %v", err)
		}
		return nil
	})
}
