package main

import (
	"fmt"
	"math"
)

// rng is splitmix64 (Steele et al. 2014): small, seedable, the same on every platform.
type rng struct{ state uint64 }

func newRNG(seed uint64) *rng { return &rng{seed} }

func (r *rng) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// uniform is in [-1, 1).
func (r *rng) uniform() float32 { return float32(float64(r.next()>>11)*0x1p-52 - 1) }

// loraShapes lists a job's params: per layer, q_proj's and v_proj's A [r, hidden] and B
// [out, r], under the names peft gives them (without its "base_model.model." prefix).
func loraShapes(cfg ModelConfig, rank int) (names []string, shapes [][2]int) {
	for l := 0; l < cfg.Layers; l++ {
		for _, m := range []struct {
			proj string
			out  int
		}{{"q_proj", cfg.Heads * cfg.HeadDim}, {"v_proj", cfg.KVHeads * cfg.HeadDim}} {
			p := fmt.Sprintf("model.layers.%d.self_attn.%s.", l, m.proj)
			names = append(names, p+"lora_A.weight", p+"lora_B.weight")
			shapes = append(shapes, [2]int{rank, cfg.Hidden}, [2]int{m.out, rank})
		}
	}
	return names, shapes
}

// loraOver arranges slices in loraShapes' order as a LoRA.
func loraOver(cfg ModelConfig, rank int, alpha float64, slices [][]float32) *LoRA {
	lo := &LoRA{Rank: rank, Scale: float32(alpha / float64(rank))}
	for l := 0; l < cfg.Layers; l++ {
		s := slices[4*l : 4*l+4]
		lo.QA, lo.QB = append(lo.QA, s[0]), append(lo.QB, s[1])
		lo.VA, lo.VB = append(lo.VA, s[2]), append(lo.VB, s[3])
	}
	return lo
}

// initLoRA sets A as peft does, kaiming_uniform(a=sqrt(5)): uniform in +-1/sqrt(in), from
// seed; and B to zero, so the adapter starts as the base model.
func initLoRA(slices [][]float32, shapes [][2]int, seed uint64) {
	r := newRNG(seed)
	for i, s := range slices {
		if i%2 == 1 {
			for j := range s {
				s[j] = 0
			}
			continue
		}
		bound := float32(1 / math.Sqrt(float64(shapes[i][1])))
		for j := range s {
			s[j] = bound * r.uniform()
		}
	}
}

// newLoRAArrays is a LoRA over arrays of its own (the tests' and the probes').
func newLoRAArrays(cfg ModelConfig, rank int, alpha float64, seed uint64) (*LoRA, [][]float32) {
	_, shapes := loraShapes(cfg, rank)
	slices := make([][]float32, len(shapes))
	for i, s := range shapes {
		slices[i] = make([]float32, s[0]*s[1])
	}
	if seed != 0 {
		initLoRA(slices, shapes, seed)
	}
	return loraOver(cfg, rank, alpha, slices), slices
}

// batchLoss returns the mean next-token cross-entropy over every position of seqs (each
// of T+1 tokens: inputs seq[:T], targets seq[1:]); with grads, it adds the gradient of
// that mean into them.
func (b *Base) batchLoss(seqs [][]int, lora, grads *LoRA) float64 {
	tokens := 0
	for _, s := range seqs {
		tokens += len(s) - 1
	}
	var sum float64
	for _, s := range seqs {
		pa := b.forward(s[:len(s)-1], lora)
		loss, dl := pa.lossAndGrad(s[1:], b.Cfg.Vocab, 1/float32(tokens))
		sum += loss
		if grads != nil {
			b.backward(pa, dl, lora, grads)
		}
	}
	return sum / float64(tokens)
}

// sampleBatch picks the sequences of step `step` (counted from 0): batch windows of
// seqLen+1 bytes of data at offsets drawn from the job's seed, the same whatever the
// ranks; rank r of world takes its contiguous share.
func sampleBatch(data []byte, seed uint64, step, batch, seqLen, rank, world int) [][]int {
	r := newRNG(seed ^ (uint64(step+1) * 0xd1b54a32d192ed03))
	span := uint64(len(data) - seqLen)
	per := batch / world
	var seqs [][]int
	for i := 0; i < batch; i++ {
		off := int(r.next() % span)
		if i/per != rank {
			continue
		}
		s := make([]int, seqLen+1)
		for j := range s {
			s[j] = int(data[off+j])
		}
		seqs = append(seqs, s)
	}
	return seqs
}
