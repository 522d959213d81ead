package main

import (
	"math"
	"testing"
)

// randomBase is a small Llama with weights large enough that every path of the backward
// carries gradient (grouped-query attention: 4 heads over 2 key/value heads).
func randomBase(seed uint64) *Base {
	cfg := ModelConfig{Vocab: 11, Hidden: 8, Inter: 12, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 2,
		MaxPositions: 16, Eps: 1e-6, RopeTheta: 10000}
	rng := newRNG(seed)
	fill := func(n int, scale float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = scale * rng.uniform()
		}
		return v
	}
	d, f, q, kv := cfg.Hidden, cfg.Inter, cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim
	b := &Base{Cfg: cfg, Embed: fill(cfg.Vocab*d, 1), Norm: fill(d, 1), LMHead: fill(cfg.Vocab*d, 0.7)}
	for l := 0; l < cfg.Layers; l++ {
		b.Layers = append(b.Layers, Layer{InNorm: fill(d, 1), PostNorm: fill(d, 1), Wq: fill(q*d, 0.6),
			Wk: fill(kv*d, 0.6), Wv: fill(kv*d, 0.6), Wo: fill(d*q, 0.5), Wg: fill(f*d, 0.5), Wu: fill(f*d, 0.5),
			Wd: fill(d*f, 0.5)})
	}
	b.rope()
	return b
}

// TestBackwardMatchesFiniteDifferences checks every LoRA gradient element against a
// central difference of the loss.
func TestBackwardMatchesFiniteDifferences(t *testing.T) {
	b := randomBase(1)
	lora, _ := newLoRAArrays(b.Cfg, 3, 2, 5)
	rng := newRNG(9)
	for _, ms := range [][][]float32{lora.QB, lora.VB} { // B starts at zero: make A's gradient non-zero
		for _, m := range ms {
			for i := range m {
				m[i] = 0.5 * rng.uniform()
			}
		}
	}
	grads, _ := newLoRAArrays(b.Cfg, 3, 2, 0)
	seqs := [][]int{{1, 4, 7, 2, 9, 3, 0}, {5, 5, 10, 2, 8, 1, 6}}
	loss := func() float64 { return b.batchLoss(seqs, lora, nil) }
	b.batchLoss(seqs, lora, grads)
	const eps = 1e-2
	checked := 0
	for _, pair := range [][2][][]float32{{lora.QA, grads.QA}, {lora.QB, grads.QB}, {lora.VA, grads.VA},
		{lora.VB, grads.VB}} {
		for l := range pair[0] {
			p, g := pair[0][l], pair[1][l]
			for i := range p {
				orig := p[i]
				p[i] = orig + eps
				up := loss()
				p[i] = orig - eps
				down := loss()
				p[i] = orig
				fd := (up - down) / (2 * eps)
				if diff := math.Abs(fd - float64(g[i])); diff > 2e-4+5e-3*math.Abs(fd) {
					t.Fatalf("layer %d element %d: backward %g, finite difference %g", l, i, g[i], fd)
				}
				checked++
			}
		}
	}
	if checked == 0 {
		t.Fatal("no gradient element checked")
	}
}

// TestRopeInverseIsTranspose: the backward's rotation undoes the forward's (a rotation's
// transpose is its inverse).
func TestRopeInverseIsTranspose(t *testing.T) {
	b := randomBase(2)
	x := make([]float32, 5*4*b.Cfg.HeadDim)
	rng := newRNG(3)
	for i := range x {
		x[i] = rng.uniform()
	}
	y := append([]float32(nil), x...)
	b.applyRope(y, 5, 4, false)
	b.applyRope(y, 5, 4, true)
	for i := range x {
		if math.Abs(float64(x[i]-y[i])) > 1e-6 {
			t.Fatalf("element %d: %g became %g", i, x[i], y[i])
		}
	}
}
