package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// JobConfig is a job's description, the body of POST /jobs. Fields left out take
// defaultJobConfig's values.
type JobConfig struct {
	Base        string  `json:"base"`          // a directory with config.json and model.safetensors (a LlamaForCausalLM)
	Data        string  `json:"data"`          // a text file; its bytes are the tokens
	Steps       int     `json:"steps"`         // optimizer steps
	Batch       int     `json:"batch"`         // sequences per step, split evenly over the ranks
	SeqLen      int     `json:"seq_len"`       // tokens per sequence
	LR          float64 `json:"lr"`            // AdamW's learning rate
	WeightDecay float64 `json:"weight_decay"`  // AdamW's decoupled weight decay
	Beta1       float64 `json:"beta1"`         // AdamW's betas and eps
	Beta2       float64 `json:"beta2"`         //
	Eps         float64 `json:"eps"`           //
	MaxGradNorm float64 `json:"max_grad_norm"` // clip the global gradient norm to this; 0: no clipping
	LoraRank    int     `json:"lora_rank"`     // r
	LoraAlpha   float64 `json:"lora_alpha"`    // the adapter's scale is lora_alpha / r
	Seed        uint64  `json:"seed"`          // the adapter's initial A and the batches drawn
}

func defaultJobConfig() JobConfig {
	return JobConfig{Steps: 50, Batch: 8, SeqLen: 32, LR: 1e-3, WeightDecay: 0.01, Beta1: 0.9, Beta2: 0.999,
		Eps: 1e-8, LoraRank: 8, LoraAlpha: 16, Seed: 1}
}

// configError is a refused job description; its text names the field and what was wrong.
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

func refuse(format string, args ...interface{}) error {
	return &configError{fmt.Sprintf(format, args...)}
}

// decodeJobConfig reads a job description: JSON, one object, no unknown fields.
func decodeJobConfig(r io.Reader) (JobConfig, error) {
	cfg := defaultJobConfig()
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typeErr):
			return cfg, refuse("%s: expected %s, got JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return cfg, refuse("unknown field %s (the fields are those of JobConfig in samples/go-finetune/README.md)",
				strings.TrimPrefix(err.Error(), "json: unknown field "))
		case err == io.EOF:
			return cfg, refuse("malformed JSON: the body is empty; expected a job description object")
		}
		return cfg, refuse("malformed JSON: %v", err)
	}
	if dec.More() {
		return cfg, refuse("malformed JSON: more than one value in the body")
	}
	if _, err := dec.Token(); err != io.EOF {
		return cfg, refuse("malformed JSON: data after the job description object")
	}
	return cfg, nil
}

// validate checks the numbers alone (the files are checked by prepare).
func (c *JobConfig) validate(world int) error {
	finite := func(name string, v float64) error {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return refuse("%s: must be finite, got %v", name, v)
		}
		return nil
	}
	for name, v := range map[string]float64{"lr": c.LR, "weight_decay": c.WeightDecay, "beta1": c.Beta1,
		"beta2": c.Beta2, "eps": c.Eps, "max_grad_norm": c.MaxGradNorm, "lora_alpha": c.LoraAlpha} {
		if err := finite(name, v); err != nil {
			return err
		}
	}
	switch {
	case c.Base == "":
		return refuse("base: required (a directory holding config.json and model.safetensors)")
	case c.Data == "":
		return refuse("data: required (a text file)")
	case c.Steps < 1 || c.Steps > 1000000:
		return refuse("steps: must be in [1, 1000000], got %d", c.Steps)
	case c.Batch < world || c.Batch%world != 0:
		return refuse("batch: must be a positive multiple of the %d ranks, got %d", world, c.Batch)
	case c.SeqLen < 1:
		return refuse("seq_len: must be at least 1, got %d", c.SeqLen)
	case c.LR < 0:
		return refuse("lr: must be >= 0, got %v", c.LR)
	case c.WeightDecay < 0:
		return refuse("weight_decay: must be >= 0, got %v", c.WeightDecay)
	case c.Beta1 < 0 || c.Beta1 >= 1 || c.Beta2 < 0 || c.Beta2 >= 1:
		return refuse("beta1, beta2: must be in [0, 1), got %v, %v", c.Beta1, c.Beta2)
	case c.Eps <= 0:
		return refuse("eps: must be > 0, got %v", c.Eps)
	case c.MaxGradNorm < 0:
		return refuse("max_grad_norm: must be >= 0 (0: no clipping), got %v", c.MaxGradNorm)
	case c.LoraRank < 1:
		return refuse("lora_rank: must be at least 1, got %d", c.LoraRank)
	case c.LoraAlpha <= 0:
		return refuse("lora_alpha: must be > 0, got %v", c.LoraAlpha)
	}
	return nil
}

// prepared is a checked job: its base model (shared) and its data.
type prepared struct {
	cfg  JobConfig
	base *Base
	data []byte
}

// prepare checks cfg against its files: the base model reads and fits, the data file is
// long enough and its bytes are tokens of the model's vocabulary.
func prepare(cfg JobConfig, world int, bases *baseCache) (*prepared, error) {
	if err := cfg.validate(world); err != nil {
		return nil, err
	}
	if st, err := os.Stat(cfg.Base); err != nil || !st.IsDir() {
		return nil, refuse("base: %q is not a directory (%v)", cfg.Base, errOr(err, "a file"))
	}
	base, err := bases.get(cfg.Base)
	if err != nil {
		return nil, refuse("base: %q: %v", cfg.Base, err)
	}
	if cfg.SeqLen > base.Cfg.MaxPositions {
		return nil, refuse("seq_len: %d passes the base model's max_position_embeddings, %d", cfg.SeqLen,
			base.Cfg.MaxPositions)
	}
	if limit := minInt(base.Cfg.Hidden, base.Cfg.KVHeads*base.Cfg.HeadDim); cfg.LoraRank > limit {
		return nil, refuse("lora_rank: %d passes the smallest adapted dimension of the base model, %d", cfg.LoraRank, limit)
	}
	data, err := os.ReadFile(cfg.Data)
	if err != nil {
		return nil, refuse("data: %v", err)
	}
	if len(data) < cfg.SeqLen+1 {
		return nil, refuse("data: %q holds %d bytes; seq_len %d needs at least %d", cfg.Data, len(data), cfg.SeqLen,
			cfg.SeqLen+1)
	}
	for i, c := range data {
		if int(c) >= base.Cfg.Vocab {
			return nil, refuse("data: byte %d at offset %d is outside the base model's vocabulary of %d tokens", c, i,
				base.Cfg.Vocab)
		}
	}
	abs, _ := filepath.Abs(cfg.Base)
	cfg.Base = abs
	return &prepared{cfg: cfg, base: base, data: data}, nil
}

func errOr(err error, what string) interface{} {
	if err != nil {
		return err
	}
	return what
}

func minInt(a, b int) int {
	if a < b {
		return a
	}
	return b
}
