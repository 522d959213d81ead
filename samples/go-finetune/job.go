package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	sx "github.com/sx-runtime/sx/bindings/go"
)

// Progress is one line of a job's progress stream: after each optimizer step, the mean
// loss of that step's batch (before the update) and the step's throughput.
type Progress struct {
	Step            int     `json:"step"`
	Loss            float64 `json:"loss"`
	TokensPerSecond float64 `json:"tokens_per_second"`
}

// Job states.
const (
	stateQueued    = "queued"
	stateRunning   = "running"
	stateFinished  = "finished"
	stateCancelled = "cancelled"
	stateFailed    = "failed"
)

// Job is one fine-tune: a group named after it in the service's context, on every rank.
type Job struct {
	ID     string
	Dir    string // holds checkpoint/, adapter/, losses.json and logits.json
	p      *prepared
	cancel atomic.Bool

	mu       sync.Mutex
	state    string
	err      string
	progress []Progress
	saved    bool          // checkpoint/ and adapter/ are written
	changed  chan struct{} // closed (and replaced) at every change
}

func newJob(id, dir string, p *prepared) *Job {
	return &Job{ID: id, Dir: dir, p: p, state: stateQueued, changed: make(chan struct{})}
}

// update changes the job under its lock and wakes whoever follows it.
func (j *Job) update(f func()) {
	j.mu.Lock()
	defer j.mu.Unlock()
	f()
	close(j.changed)
	j.changed = make(chan struct{})
}

func (j *Job) done() bool {
	return j.state == stateFinished || j.state == stateCancelled || j.state == stateFailed
}

// Ranks are this process's handles of one context: rank r's is ctxs[r]. Every job is a
// group in it, made and stepped by one goroutine per rank.
type Ranks struct {
	ctxs []*sx.Context
}

// newRanks makes a context of world ranks, goroutines of this process over local://name.
func newRanks(name string, world, threads int, timeout time.Duration) (*Ranks, error) {
	r := &Ranks{ctxs: make([]*sx.Context, world)}
	errs := make([]error, world)
	var wg sync.WaitGroup
	for rank := 0; rank < world; rank++ {
		wg.Add(1)
		go func(rank int) {
			defer wg.Done()
			r.ctxs[rank], errs[rank] = sx.NewContext(sx.ContextConfig{Rendezvous: "local://" + name,
				Rank: int32(rank), WorldSize: int32(world), Backend: sx.BackendCPU, NumThreads: int32(threads),
				TimeoutMs: int32(timeout / time.Millisecond)})
		}(rank)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}

// Close releases the handles; the context goes with its last group.
func (r *Ranks) Close() {
	for _, c := range r.ctxs {
		if c != nil {
			c.Close()
		}
	}
}

// run trains the job on every rank at once and records how it ended.
func (j *Job) run(r *Ranks) {
	j.update(func() { j.state = stateRunning })
	world := len(r.ctxs)
	errs := make([]error, world)
	cancelled := make([]bool, world)
	var wg sync.WaitGroup
	for rank := 0; rank < world; rank++ {
		wg.Add(1)
		go func(rank int) {
			defer wg.Done()
			cancelled[rank], errs[rank] = j.runRank(r.ctxs[rank], rank, world)
		}(rank)
	}
	wg.Wait()
	var err error
	for _, e := range errs {
		if e != nil {
			err = e
			break
		}
	}
	if err == nil {
		err = j.writeResults()
	}
	j.update(func() {
		switch {
		case err != nil:
			j.state, j.err = stateFailed, err.Error()
		case cancelled[0]:
			j.state, j.saved = stateCancelled, true
		default:
			j.state, j.saved = stateFinished, true
		}
	})
}

// runRank is one rank's part: make the job's group, train until the steps are done or a
// cancel is seen, then save the optimizer state and write the adapter (both collective).
// It reports whether the job was cancelled.
func (j *Job) runRank(ctx *sx.Context, rank, world int) (bool, error) {
	// Not needed for sx (the binding reads its errors on the calling thread itself); it
	// keeps a rank's trace events on one row (GroupConfig.TracePath).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cfg, base := j.p.cfg, j.p.base
	g, err := sx.NewShardGroup(sx.GroupConfig{Context: ctx, Name: j.ID})
	if err != nil {
		return false, err
	}
	defer g.Close()
	params, grads, err := addLoRAParams(g, cfg, base.Cfg)
	if err != nil {
		return false, err
	}
	lora := loraOver(base.Cfg, cfg.LoraRank, cfg.LoraAlpha, params)
	gradLoRA := loraOver(base.Cfg, cfg.LoraRank, cfg.LoraAlpha, grads)
	tokens := float64(cfg.Batch * cfg.SeqLen)
	cancelled, steps := false, 0
	for ; steps < cfg.Steps && !cancelled; steps++ {
		step := steps
		start := time.Now()
		seqs := sampleBatch(j.p.data, cfg.Seed, step, cfg.Batch, cfg.SeqLen, rank, world)
		loss := base.batchLoss(seqs, lora, gradLoRA)
		// sx averages the ranks' gradients (each the mean over its sequences), steps AdamW
		// and zeroes the gradients for the next backward.
		if _, err := g.Step(&sx.StepOptions{MaxGradNorm: cfg.MaxGradNorm}); err != nil {
			return false, err
		}
		// The ranks agree on the loss and on stopping: a cancel seen by any rank stops
		// every rank after this same step.
		vote := 0.0
		if j.cancel.Load() {
			vote = 1
		}
		sums := []float64{loss, vote}
		if err := g.AllReduce(sums, sx.ReduceSum); err != nil {
			return false, err
		}
		cancelled = sums[1] > 0
		if rank == 0 {
			p := Progress{Step: step + 1, Loss: sums[0] / float64(world),
				TokensPerSecond: tokens / time.Since(start).Seconds()}
			j.update(func() { j.progress = append(j.progress, p) })
		}
	}
	return cancelled, j.save(g, rank, steps)
}

// addLoRAParams registers the adapter's matrices in g (AdamW with the job's
// hyperparameters), lays them out and initialises them; it returns the params' and the
// gradients' slices over sx's buffers.
func addLoRAParams(g *sx.ShardGroup, cfg JobConfig, model ModelConfig) ([][]float32, [][]float32, error) {
	pg := sx.NewParamGroup(sx.AdamW)
	pg.LR, pg.WeightDecay, pg.Beta1, pg.Beta2, pg.Eps = cfg.LR, cfg.WeightDecay, cfg.Beta1, cfg.Beta2, cfg.Eps
	if _, err := g.AddParamGroup(pg); err != nil {
		return nil, nil, err
	}
	names, shapes := loraShapes(model, cfg.LoraRank)
	for i, name := range names {
		if _, err := g.AddParam(sx.Param{Name: name, Shape: []int64{int64(shapes[i][0]), int64(shapes[i][1])}}); err != nil {
			return nil, nil, err
		}
	}
	if err := g.Finalize(); err != nil {
		return nil, nil, err
	}
	params, grads := make([][]float32, len(names)), make([][]float32, len(names))
	for i := range names {
		var err error
		if params[i], err = g.Param(int32(i)); err != nil {
			return nil, nil, err
		}
		if grads[i], err = g.Grad(int32(i)); err != nil {
			return nil, nil, err
		}
		for k := range grads[i] {
			grads[i][k] = 0
		}
	}
	// Every rank draws the same initial values from the job's seed.
	initLoRA(params, shapes, cfg.Seed)
	return params, grads, nil
}

// save writes the job's checkpoint (the params and AdamW's state, with the job's
// description and steps as the user blob) and its adapter in PEFT's format.
func (j *Job) save(g *sx.ShardGroup, rank, steps int) error {
	blob, err := json.Marshal(map[string]interface{}{"config": j.p.cfg, "steps": steps})
	if err != nil {
		return err
	}
	f, err := g.Save(sx.SaveOptions{Path: filepath.Join(j.Dir, "checkpoint"), UserBlob: blob})
	if err != nil {
		return fmt.Errorf("saving the checkpoint: %w", err)
	}
	err = f.Wait()
	f.Close()
	if err != nil {
		return fmt.Errorf("saving the checkpoint: %w", err)
	}
	names, _ := loraShapes(j.p.base.Cfg, j.p.cfg.LoraRank)
	pairs := make([]sx.NamePair, len(names))
	for i, n := range names {
		pairs[i] = sx.NamePair{SxName: n, FileName: "base_model.model." + n}
	}
	err = g.ExportPEFT(filepath.Join(j.Dir, "adapter"), sx.HFExportOptions{Names: pairs, OnlyNamed: true},
		sx.PEFTConfig{BaseModelNameOrPath: j.p.cfg.Base, TaskType: "CAUSAL_LM",
			TargetModules: []string{"q_proj", "v_proj"}, R: int32(j.p.cfg.LoraRank), LoraAlpha: j.p.cfg.LoraAlpha})
	if err != nil {
		return fmt.Errorf("writing the adapter: %w", err)
	}
	if rank == 0 {
		return j.writeProbe(g)
	}
	return nil
}

// writeProbe writes logits.json: the adapted model's logits for the first seq_len bytes
// of the data, from the trained params as they are in sx, for checking the adapter
// against peft's model.
func (j *Job) writeProbe(g *sx.ShardGroup) error {
	cfg, base := j.p.cfg, j.p.base
	names, _ := loraShapes(base.Cfg, cfg.LoraRank)
	params := make([][]float32, len(names))
	for i := range names {
		var err error
		if params[i], err = g.Param(int32(i)); err != nil {
			return err
		}
	}
	ids := make([]int, cfg.SeqLen)
	for i := range ids {
		ids[i] = int(j.p.data[i])
	}
	pa := base.forward(ids, loraOver(base.Cfg, cfg.LoraRank, cfg.LoraAlpha, params))
	V := base.Cfg.Vocab
	rows := make([][]float32, len(ids))
	for t := range rows {
		rows[t] = pa.logits[t*V : (t+1)*V]
	}
	return writeJSON(filepath.Join(j.Dir, "logits.json"), map[string]interface{}{"input_ids": ids, "logits": rows})
}

// writeResults writes losses.json: every step's loss, as the progress stream gave them.
func (j *Job) writeResults() error {
	j.mu.Lock()
	losses := make([]float64, len(j.progress))
	for i, p := range j.progress {
		losses[i] = p.Loss
	}
	j.mu.Unlock()
	return writeJSON(filepath.Join(j.Dir, "losses.json"), losses)
}

func writeJSON(path string, v interface{}) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
