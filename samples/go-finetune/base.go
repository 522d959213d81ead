package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
)

// ModelConfig is what the forward needs of a Hugging Face LlamaConfig (config.json).
type ModelConfig struct {
	Vocab, Hidden, Inter, Layers int
	Heads, KVHeads, HeadDim      int
	MaxPositions                 int
	Eps, RopeTheta               float64
	Tied                         bool
}

// hfLlamaConfig is config.json as transformers writes it for LlamaForCausalLM; rope_theta
// is top-level before transformers 5 and in rope_parameters since.
type hfLlamaConfig struct {
	ModelType      string   `json:"model_type"`
	Architectures  []string `json:"architectures"`
	VocabSize      int      `json:"vocab_size"`
	HiddenSize     int      `json:"hidden_size"`
	Intermediate   int      `json:"intermediate_size"`
	Layers         int      `json:"num_hidden_layers"`
	Heads          int      `json:"num_attention_heads"`
	KVHeads        int      `json:"num_key_value_heads"`
	HeadDim        int      `json:"head_dim"`
	MaxPositions   int      `json:"max_position_embeddings"`
	RMSNormEps     float64  `json:"rms_norm_eps"`
	HiddenAct      string   `json:"hidden_act"`
	AttentionBias  bool     `json:"attention_bias"`
	MLPBias        bool     `json:"mlp_bias"`
	TieEmbeddings  bool     `json:"tie_word_embeddings"`
	RopeTheta      float64  `json:"rope_theta"`
	RopeParameters *struct {
		RopeTheta float64 `json:"rope_theta"`
		RopeType  string  `json:"rope_type"`
	} `json:"rope_parameters"`
	RopeScaling map[string]interface{} `json:"rope_scaling"`
}

func parseModelConfig(raw []byte) (ModelConfig, error) {
	var c hfLlamaConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return ModelConfig{}, fmt.Errorf("config.json: %v", err)
	}
	if c.ModelType != "llama" {
		return ModelConfig{}, fmt.Errorf("config.json: model_type %q; this service trains \"llama\" models", c.ModelType)
	}
	theta := c.RopeTheta
	if c.RopeParameters != nil {
		if t := c.RopeParameters.RopeType; t != "" && t != "default" {
			return ModelConfig{}, fmt.Errorf("config.json: rope_type %q; only \"default\" RoPE is implemented", t)
		}
		if c.RopeParameters.RopeTheta != 0 {
			theta = c.RopeParameters.RopeTheta
		}
	}
	if theta == 0 {
		theta = 10000
	}
	if len(c.RopeScaling) > 0 {
		return ModelConfig{}, fmt.Errorf("config.json: rope_scaling is set; only unscaled RoPE is implemented")
	}
	if c.HiddenAct != "silu" || c.AttentionBias || c.MLPBias {
		return ModelConfig{}, fmt.Errorf("config.json: hidden_act %q, attention_bias %v, mlp_bias %v; this service "+
			"implements silu without biases", c.HiddenAct, c.AttentionBias, c.MLPBias)
	}
	m := ModelConfig{Vocab: c.VocabSize, Hidden: c.HiddenSize, Inter: c.Intermediate, Layers: c.Layers,
		Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, MaxPositions: c.MaxPositions, Eps: c.RMSNormEps,
		RopeTheta: theta, Tied: c.TieEmbeddings}
	if m.KVHeads == 0 {
		m.KVHeads = m.Heads
	}
	if m.Heads > 0 && m.HeadDim == 0 {
		m.HeadDim = m.Hidden / m.Heads
	}
	if m.Vocab <= 0 || m.Hidden <= 0 || m.Inter <= 0 || m.Layers <= 0 || m.Heads <= 0 || m.HeadDim <= 0 ||
		m.HeadDim%2 != 0 || m.Heads%m.KVHeads != 0 || m.MaxPositions <= 0 {
		return ModelConfig{}, fmt.Errorf("config.json: sizes %+v are not a Llama's (positive, an even head_dim, "+
			"num_attention_heads a multiple of num_key_value_heads)", m)
	}
	return m, nil
}

// Layer holds one decoder layer's frozen weights, each [out, in] row-major as torch's
// nn.Linear keeps them.
type Layer struct {
	InNorm, PostNorm           []float32
	Wq, Wk, Wv, Wo, Wg, Wu, Wd []float32
}

// Base is a frozen base model, read once and shared read-only by every job on it.
type Base struct {
	Cfg      ModelConfig
	Embed    []float32 // [vocab, hidden]
	Layers   []Layer
	Norm     []float32
	LMHead   []float32 // [vocab, hidden]; Embed where the embeddings are tied
	cos, sin []float32 // [max positions, head dim], as transformers' LlamaRotaryEmbedding
}

// loadBase reads dir/config.json and dir/model.safetensors, checking every tensor's shape.
func loadBase(dir string) (*Base, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	cfg, err := parseModelConfig(raw)
	if err != nil {
		return nil, err
	}
	values, shapes, err := readSafetensors(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return nil, err
	}
	b := &Base{Cfg: cfg}
	take := func(name string, shape ...int64) []float32 {
		if err != nil {
			return nil
		}
		v, ok := values[name]
		if !ok {
			err = fmt.Errorf("model.safetensors has no tensor %q", name)
			return nil
		}
		if fmt.Sprint(shapes[name]) != fmt.Sprint(shape) {
			err = fmt.Errorf("model.safetensors: %q has shape %v; config.json makes it %v", name, shapes[name], shape)
		}
		return v
	}
	d, f, v := int64(cfg.Hidden), int64(cfg.Inter), int64(cfg.Vocab)
	q, kv := int64(cfg.Heads*cfg.HeadDim), int64(cfg.KVHeads*cfg.HeadDim)
	b.Embed = take("model.embed_tokens.weight", v, d)
	for l := 0; l < cfg.Layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		b.Layers = append(b.Layers, Layer{
			InNorm: take(p+"input_layernorm.weight", d), PostNorm: take(p+"post_attention_layernorm.weight", d),
			Wq: take(p+"self_attn.q_proj.weight", q, d), Wk: take(p+"self_attn.k_proj.weight", kv, d),
			Wv: take(p+"self_attn.v_proj.weight", kv, d), Wo: take(p+"self_attn.o_proj.weight", d, q),
			Wg: take(p+"mlp.gate_proj.weight", f, d), Wu: take(p+"mlp.up_proj.weight", f, d),
			Wd: take(p+"mlp.down_proj.weight", d, f)})
	}
	b.Norm = take("model.norm.weight", d)
	if cfg.Tied {
		b.LMHead = b.Embed
	} else {
		b.LMHead = take("lm_head.weight", v, d)
	}
	if err != nil {
		return nil, err
	}
	b.rope()
	return b, nil
}

// rope fills the cos and sin tables: position p, frequency i of head_dim/2 is
// p / theta^(2i/head_dim), repeated for both halves (transformers' rotate_half layout).
func (b *Base) rope() {
	hd := b.Cfg.HeadDim
	b.cos = make([]float32, b.Cfg.MaxPositions*hd)
	b.sin = make([]float32, b.Cfg.MaxPositions*hd)
	for p := 0; p < b.Cfg.MaxPositions; p++ {
		for i := 0; i < hd/2; i++ {
			invFreq := float32(1 / math.Pow(b.Cfg.RopeTheta, float64(2*i)/float64(hd)))
			angle := float64(float32(p) * invFreq)
			c, s := float32(math.Cos(angle)), float32(math.Sin(angle))
			b.cos[p*hd+i], b.cos[p*hd+i+hd/2] = c, c
			b.sin[p*hd+i], b.sin[p*hd+i+hd/2] = s, s
		}
	}
}

// baseCache reads each base directory once; every job on it shares the one copy.
type baseCache struct {
	mu    sync.Mutex
	bases map[string]*baseEntry
}

type baseEntry struct {
	once sync.Once
	base *Base
	err  error
}

func (c *baseCache) get(dir string) (*Base, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.bases == nil {
		c.bases = map[string]*baseEntry{}
	}
	e, ok := c.bases[abs]
	if !ok {
		e = &baseEntry{}
		c.bases[abs] = e
	}
	c.mu.Unlock()
	e.once.Do(func() { e.base, e.err = loadBase(abs) })
	if e.err != nil {
		// A failed read is not kept: the directory may be fixed and the job posted again.
		c.mu.Lock()
		if c.bases[abs] == e {
			delete(c.bases, abs)
		}
		c.mu.Unlock()
	}
	return e.base, e.err
}
