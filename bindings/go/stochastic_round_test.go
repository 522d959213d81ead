package sx

import "testing"

// A param group with BF16StochasticRound keeps its bf16 params without fp32 masters: the
// key reads back, a step runs, and the optimizer bytes are the bf16 moments' alone (two
// slots of 2 bytes per element). An fp32 param in such a group is refused, naming it.
func TestBF16StochasticRoundKeepsNoMasters(t *testing.T) {
	const n = 4096
	runRanks(t, "stochastic-round", 1, func(rank int32, g *ShardGroup) error {
		pg := NewParamGroup(AdamW)
		pg.StateDtype, pg.BF16StochasticRound = StateDtypeBF16, true
		if _, err := g.AddParamGroup(pg); err != nil {
			return err
		}
		if _, err := g.AddParam(Param{Name: "w", Shape: []int64{n}, Dtype: DtypeBF16}); err != nil {
			return err
		}
		if err := g.Finalize(); err != nil {
			return err
		}
		if v, err := g.GetHyperparameter(0, HPBF16StochasticRound); err != nil || v != 1 {
			t.Errorf("bf16_stochastic_round reads back %v (%v), not 1", v, err)
		}
		if _, err := g.Step(nil); err != nil {
			return err
		}
		m, err := g.MemoryStats()
		if err != nil {
			return err
		}
		if m.OptimizerBytes != 4*n {
			t.Errorf("optimizer bytes %d, not the bf16 moments' %d", m.OptimizerBytes, 4*n)
		}
		return nil
	})
	runRanks(t, "stochastic-round-fp32", 1, func(rank int32, g *ShardGroup) error {
		pg := NewParamGroup(AdamW)
		pg.BF16StochasticRound = true
		if _, err := g.AddParamGroup(pg); err != nil {
			return err
		}
		if _, err := g.AddParam(Param{Name: "fp32_w", Shape: []int64{8}}); err != nil {
			return err
		}
		if err := g.Finalize(); statusOf(err) != ErrInvalidArgument {
			t.Errorf("an fp32 param in a bf16_stochastic_round group: %v", err)
		}
		return nil
	})
}
