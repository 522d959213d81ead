package main

import (
	"math"
)

// The model: transformers' LlamaForCausalLM (RMSNorm, rotary position embeddings,
// grouped-query attention with a causal mask, a SiLU-gated MLP), with LoRA (Hu et al.
// 2021, peft's LoraLayer) on q_proj and v_proj: q = x Wq^T + scale * (x A^T) B^T, scale =
// lora_alpha / r. Everything is float32, one sequence at a time; the backward gives the
// gradients of the LoRA matrices only, through the whole (frozen) network.

// LoRA is a job's adapter: per layer, A [r, hidden] and B [out, r] of q_proj and v_proj,
// as slices over the job's sx params.
type LoRA struct {
	Rank           int
	Scale          float32
	QA, QB, VA, VB [][]float32
}

// layerActs is what one layer's forward keeps for its backward.
type layerActs struct {
	x, h1, x2, h2 []float32 // the layer's input, its normed input, the residual after attention, its norm
	r1, r2        []float32 // the norms' reciprocal RMS per position
	tq, tv        []float32 // x A^T of q and v: [T, r]
	q, k, v       []float32 // after rotary embedding (q, k): [T, heads*hd], [T, kv*hd]
	p             []float32 // attention probabilities: [heads, T, T]
	o             []float32 // attention output before o_proj: [T, heads*hd]
	gate, up, act []float32 // [T, inter]
}

// pass is one sequence's forward, kept for the backward.
type pass struct {
	T      int
	layers []layerActs
	xf, hf []float32
	rf     []float32
	logits []float32 // [T, vocab]
}

// linear sets y[t, o] = sum_i x[t, i] w[o, i] (w is [out, in], as nn.Linear's weight).
func linear(y, x, w []float32, T, in, out int) {
	for t := 0; t < T; t++ {
		xt := x[t*in : (t+1)*in]
		for o := 0; o < out; o++ {
			wo := w[o*in : (o+1)*in]
			var s float32
			for i, xv := range xt {
				s += xv * wo[i]
			}
			y[t*out+o] = s
		}
	}
}

// linearBackInput adds dy w into dx (the gradient of x in y = x w^T).
func linearBackInput(dx, dy, w []float32, T, in, out int) {
	for t := 0; t < T; t++ {
		dxt := dx[t*in : (t+1)*in]
		for o := 0; o < out; o++ {
			g := dy[t*out+o]
			if g == 0 {
				continue
			}
			wo := w[o*in : (o+1)*in]
			for i := range dxt {
				dxt[i] += g * wo[i]
			}
		}
	}
}

// linearBackWeight adds scale * dy^T x into dw (the gradient of w in y = x w^T).
func linearBackWeight(dw, dy, x []float32, T, in, out int, scale float32) {
	for t := 0; t < T; t++ {
		xt := x[t*in : (t+1)*in]
		for o := 0; o < out; o++ {
			g := scale * dy[t*out+o]
			if g == 0 {
				continue
			}
			dwo := dw[o*in : (o+1)*in]
			for i, xv := range xt {
				dwo[i] += g * xv
			}
		}
	}
}

// rmsNorm sets y = w * x / sqrt(mean(x^2) + eps) per row, keeping the reciprocal in r
// (LlamaRMSNorm).
func rmsNorm(y, r, x, w []float32, T, d int, eps float64) {
	for t := 0; t < T; t++ {
		xt := x[t*d : (t+1)*d]
		var ss float32
		for _, v := range xt {
			ss += v * v
		}
		rt := float32(1 / math.Sqrt(float64(ss/float32(d))+eps))
		r[t] = rt
		for i, v := range xt {
			y[t*d+i] = w[i] * (v * rt)
		}
	}
}

// rmsNormBack adds the gradient of x into dx: with g = dy * w,
// dx_i = r g_i - r^3 x_i mean_j(g_j x_j).
func rmsNormBack(dx, dy, x, r, w []float32, T, d int) {
	for t := 0; t < T; t++ {
		xt, dyt := x[t*d:(t+1)*d], dy[t*d:(t+1)*d]
		var gx float32
		for i := range xt {
			gx += dyt[i] * w[i] * xt[i]
		}
		rt := r[t]
		c := rt * rt * rt * gx / float32(d)
		for i := range xt {
			dx[t*d+i] += rt*dyt[i]*w[i] - c*xt[i]
		}
	}
}

// applyRope rotates each head of x [T, heads*hd] in place: x*cos + rotate_half(x)*sin,
// rotate_half(x) = (-x2, x1) for the halves x1, x2 (transformers' apply_rotary_pos_emb).
// inverse applies the transpose, for the backward.
func (b *Base) applyRope(x []float32, T, heads int, inverse bool) {
	hd := b.Cfg.HeadDim
	h2 := hd / 2
	for t := 0; t < T; t++ {
		cos, sin := b.cos[t*hd:(t+1)*hd], b.sin[t*hd:(t+1)*hd]
		for h := 0; h < heads; h++ {
			v := x[(t*heads+h)*hd : (t*heads+h+1)*hd]
			for i := 0; i < h2; i++ {
				a, c := v[i], v[i+h2]
				if inverse {
					v[i], v[i+h2] = a*cos[i]+c*sin[i+h2], c*cos[i+h2]-a*sin[i]
				} else {
					v[i], v[i+h2] = a*cos[i]-c*sin[i], c*cos[i+h2]+a*sin[i+h2]
				}
			}
		}
	}
}

func silu(x float32) float32 { return x / (1 + float32(math.Exp(float64(-x)))) }

// forward runs the sequence ids (at most MaxPositions) through the model with the
// adapter, keeping what the backward needs.
func (b *Base) forward(ids []int, lora *LoRA) *pass {
	c := b.Cfg
	T, D, F := len(ids), c.Hidden, c.Inter
	pa := &pass{T: T}
	x := make([]float32, T*D)
	for t, id := range ids {
		copy(x[t*D:(t+1)*D], b.Embed[id*D:(id+1)*D])
	}
	for l := range b.Layers {
		a := b.attentionForward(l, x, T, lora)
		w := &b.Layers[l]
		a.h2, a.r2 = make([]float32, T*D), make([]float32, T)
		rmsNorm(a.h2, a.r2, a.x2, w.PostNorm, T, D, c.Eps)
		a.gate, a.up, a.act = make([]float32, T*F), make([]float32, T*F), make([]float32, T*F)
		linear(a.gate, a.h2, w.Wg, T, D, F)
		linear(a.up, a.h2, w.Wu, T, D, F)
		for i := range a.act {
			a.act[i] = silu(a.gate[i]) * a.up[i]
		}
		m := make([]float32, T*D)
		linear(m, a.act, w.Wd, T, F, D)
		x = make([]float32, T*D)
		for i := range x {
			x[i] = a.x2[i] + m[i]
		}
		pa.layers = append(pa.layers, a)
	}
	pa.xf, pa.hf, pa.rf = x, make([]float32, T*D), make([]float32, T)
	rmsNorm(pa.hf, pa.rf, x, b.Norm, T, D, c.Eps)
	pa.logits = make([]float32, T*c.Vocab)
	linear(pa.logits, pa.hf, b.LMHead, T, D, c.Vocab)
	return pa
}

// loraProject sets y = h w^T + scale * (h a^T) b^T, keeping t = h a^T.
func loraProject(y, t, h, w, a, bm []float32, T, d, out, r int, scale float32) {
	linear(y, h, w, T, d, out)
	linear(t, h, a, T, d, r)
	delta := make([]float32, T*out)
	linear(delta, t, bm, T, r, out)
	for i := range y {
		y[i] += scale * delta[i]
	}
}

func (b *Base) attentionForward(l int, x []float32, T int, lora *LoRA) layerActs {
	c, w := b.Cfg, &b.Layers[l]
	D, H, KV, hd, r := c.Hidden, c.Heads, c.KVHeads, c.HeadDim, lora.Rank
	a := layerActs{x: x, h1: make([]float32, T*D), r1: make([]float32, T)}
	rmsNorm(a.h1, a.r1, x, w.InNorm, T, D, c.Eps)
	a.q, a.k, a.v = make([]float32, T*H*hd), make([]float32, T*KV*hd), make([]float32, T*KV*hd)
	a.tq, a.tv = make([]float32, T*r), make([]float32, T*r)
	loraProject(a.q, a.tq, a.h1, w.Wq, lora.QA[l], lora.QB[l], T, D, H*hd, r, lora.Scale)
	linear(a.k, a.h1, w.Wk, T, D, KV*hd)
	loraProject(a.v, a.tv, a.h1, w.Wv, lora.VA[l], lora.VB[l], T, D, KV*hd, r, lora.Scale)
	b.applyRope(a.q, T, H, false)
	b.applyRope(a.k, T, KV, false)
	a.p, a.o = make([]float32, H*T*T), make([]float32, T*H*hd)
	inv := float32(1 / math.Sqrt(float64(hd)))
	for h := 0; h < H; h++ {
		g := h / (H / KV)
		for t := 0; t < T; t++ {
			qt := a.q[(t*H+h)*hd : (t*H+h+1)*hd]
			p := a.p[(h*T+t)*T : (h*T+t+1)*T]
			maxv := float32(math.Inf(-1))
			for s := 0; s <= t; s++ {
				ks := a.k[(s*KV+g)*hd : (s*KV+g+1)*hd]
				var dot float32
				for i := range qt {
					dot += qt[i] * ks[i]
				}
				p[s] = dot * inv
				if p[s] > maxv {
					maxv = p[s]
				}
			}
			var sum float32
			for s := 0; s <= t; s++ {
				p[s] = float32(math.Exp(float64(p[s] - maxv)))
				sum += p[s]
			}
			ot := a.o[(t*H+h)*hd : (t*H+h+1)*hd]
			for s := 0; s <= t; s++ {
				p[s] /= sum
				vs := a.v[(s*KV+g)*hd : (s*KV+g+1)*hd]
				for i := range ot {
					ot[i] += p[s] * vs[i]
				}
			}
		}
	}
	attn := make([]float32, T*D)
	linear(attn, a.o, w.Wo, T, H*hd, D)
	a.x2 = make([]float32, T*D)
	for i := range attn {
		a.x2[i] = x[i] + attn[i]
	}
	return a
}

// lossAndGrad returns the summed cross-entropy of predicting targets[t] from position t
// and sets dlogits to its gradient times scale (scale = 1 / the tokens the loss is the mean
// over).
func (pa *pass) lossAndGrad(targets []int, vocab int, scale float32) (float64, []float32) {
	dl := make([]float32, len(pa.logits))
	var loss float64
	for t, target := range targets {
		row := pa.logits[t*vocab : (t+1)*vocab]
		maxv := row[0]
		for _, v := range row {
			if v > maxv {
				maxv = v
			}
		}
		var sum float64
		for _, v := range row {
			sum += math.Exp(float64(v - maxv))
		}
		loss += math.Log(sum) - float64(row[target]-maxv)
		d := dl[t*vocab : (t+1)*vocab]
		for i, v := range row {
			d[i] = float32(math.Exp(float64(v-maxv))/sum) * scale
		}
		d[target] -= scale
	}
	return loss, dl
}
