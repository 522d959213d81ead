package main

import "math"

// backward adds the gradients of the LoRA matrices into grads (laid out as lora) from
// dlogits, the gradient of the loss with respect to pa's logits.
func (b *Base) backward(pa *pass, dlogits []float32, lora, grads *LoRA) {
	c := b.Cfg
	T, D := pa.T, c.Hidden
	dhf := make([]float32, T*D)
	linearBackInput(dhf, dlogits, b.LMHead, T, D, c.Vocab)
	dx := make([]float32, T*D)
	rmsNormBack(dx, dhf, pa.xf, pa.rf, b.Norm, T, D)
	for l := len(b.Layers) - 1; l >= 0; l-- {
		dx = b.layerBackward(l, &pa.layers[l], dx, T, lora, grads)
	}
}

// layerBackward takes the gradient of layer l's output and returns its input's.
func (b *Base) layerBackward(l int, a *layerActs, dout []float32, T int, lora, grads *LoRA) []float32 {
	c, w := b.Cfg, &b.Layers[l]
	D, F := c.Hidden, c.Inter
	// x3 = x2 + down(silu(gate(h2)) * up(h2)), h2 = norm(x2).
	dx2 := append([]float32(nil), dout...)
	dact := make([]float32, T*F)
	linearBackInput(dact, dout, w.Wd, T, F, D)
	dgate, dup := make([]float32, T*F), make([]float32, T*F)
	for i, g := range a.gate {
		sig := float32(1 / (1 + math.Exp(float64(-g))))
		dup[i] = dact[i] * g * sig
		dgate[i] = dact[i] * a.up[i] * sig * (1 + g*(1-sig))
	}
	dh2 := make([]float32, T*D)
	linearBackInput(dh2, dgate, w.Wg, T, D, F)
	linearBackInput(dh2, dup, w.Wu, T, D, F)
	rmsNormBack(dx2, dh2, a.x2, a.r2, w.PostNorm, T, D)
	// x2 = x + o_proj(attention(h1)), h1 = norm(x).
	dx := append([]float32(nil), dx2...)
	dh1 := b.attentionBackward(l, a, dx2, T, lora, grads)
	rmsNormBack(dx, dh1, a.x, a.r1, w.InNorm, T, D)
	return dx
}

// attentionBackward takes the gradient of the attention block's output (before the
// residual add) and returns h1's, adding the LoRA gradients of layer l into grads.
func (b *Base) attentionBackward(l int, a *layerActs, dattn []float32, T int, lora, grads *LoRA) []float32 {
	c, w := b.Cfg, &b.Layers[l]
	D, H, KV, hd, r := c.Hidden, c.Heads, c.KVHeads, c.HeadDim, lora.Rank
	do := make([]float32, T*H*hd)
	linearBackInput(do, dattn, w.Wo, T, H*hd, D)
	dq, dk, dv := make([]float32, T*H*hd), make([]float32, T*KV*hd), make([]float32, T*KV*hd)
	inv := float32(1 / math.Sqrt(float64(hd)))
	dp := make([]float32, T)
	for h := 0; h < H; h++ {
		g := h / (H / KV)
		for t := 0; t < T; t++ {
			p := a.p[(h*T+t)*T : (h*T+t+1)*T]
			dot := do[(t*H+h)*hd : (t*H+h+1)*hd]
			// o_t = sum_s p_s v_s: dp_s = do_t . v_s, dv_s += p_s do_t; softmax: ds_s = p_s (dp_s - sum p dp).
			var pdp float32
			for s := 0; s <= t; s++ {
				vs := a.v[(s*KV+g)*hd : (s*KV+g+1)*hd]
				dvs := dv[(s*KV+g)*hd : (s*KV+g+1)*hd]
				var d float32
				for i := range dot {
					d += dot[i] * vs[i]
					dvs[i] += p[s] * dot[i]
				}
				dp[s] = d
				pdp += p[s] * d
			}
			qt := a.q[(t*H+h)*hd : (t*H+h+1)*hd]
			dqt := dq[(t*H+h)*hd : (t*H+h+1)*hd]
			for s := 0; s <= t; s++ {
				ds := p[s] * (dp[s] - pdp) * inv
				ks := a.k[(s*KV+g)*hd : (s*KV+g+1)*hd]
				dks := dk[(s*KV+g)*hd : (s*KV+g+1)*hd]
				for i := range qt {
					dqt[i] += ds * ks[i]
					dks[i] += ds * qt[i]
				}
			}
		}
	}
	b.applyRope(dq, T, H, true)
	b.applyRope(dk, T, KV, true)
	dh1 := make([]float32, T*D)
	linearBackInput(dh1, dk, w.Wk, T, D, KV*hd)
	loraBack(dh1, dq, a.h1, a.tq, w.Wq, lora.QA[l], lora.QB[l], grads.QA[l], grads.QB[l], T, D, H*hd, r, lora.Scale)
	loraBack(dh1, dv, a.h1, a.tv, w.Wv, lora.VA[l], lora.VB[l], grads.VA[l], grads.VB[l], T, D, KV*hd, r, lora.Scale)
	return dh1
}

// loraBack is the backward of y = h w^T + scale * t b^T with t = h a^T: it adds h's
// gradient into dh and those of a and b into da and db.
func loraBack(dh, dy, h, t, w, a, bm, da, db []float32, T, d, out, r int, scale float32) {
	linearBackInput(dh, dy, w, T, d, out)
	linearBackWeight(db, dy, t, T, r, out, scale)
	dt := make([]float32, T*r)
	linearBackInput(dt, dy, bm, T, r, out)
	for i := range dt {
		dt[i] *= scale
	}
	linearBackWeight(da, dt, h, T, d, r, 1)
	linearBackInput(dh, dt, a, T, d, r)
}
