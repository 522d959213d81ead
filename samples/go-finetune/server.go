package main

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Service is the HTTP API over the jobs (README.md lists the routes).
type Service struct {
	ranks   *Ranks
	workdir string
	bases   baseCache
	slots   chan struct{} // one per job allowed to train at once

	mu   sync.Mutex
	jobs map[string]*Job
	next int
}

func newService(ranks *Ranks, workdir string, maxRunning int) *Service {
	return &Service{ranks: ranks, workdir: workdir, slots: make(chan struct{}, maxRunning), jobs: map[string]*Job{}}
}

// maxBody bounds a job description.
const maxBody = 1 << 20

func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.URL.Path == "/stats" && r.Method == http.MethodGet {
		s.stats(w)
		return
	}
	if parts[0] != "jobs" {
		httpError(w, http.StatusNotFound, "no such route: %s (the routes are under /jobs)", r.URL.Path)
		return
	}
	if len(parts) == 1 {
		switch r.Method {
		case http.MethodPost:
			s.create(w, r)
		case http.MethodGet:
			s.list(w)
		default:
			methodNotAllowed(w, r, "GET, POST")
		}
		return
	}
	s.mu.Lock()
	j := s.jobs[parts[1]]
	s.mu.Unlock()
	if j == nil {
		httpError(w, http.StatusNotFound, "no job %q", parts[1])
		return
	}
	route := strings.Join(parts[2:], "/")
	want := map[string]string{"": http.MethodGet, "progress": http.MethodGet, "cancel": http.MethodPost,
		"adapter": http.MethodGet, "logits": http.MethodGet, "adapter/adapter_config.json": http.MethodGet,
		"adapter/adapter_model.safetensors": http.MethodGet}
	method, ok := want[route]
	switch {
	case !ok:
		httpError(w, http.StatusNotFound, "no such route: %s", r.URL.Path)
	case r.Method != method:
		methodNotAllowed(w, r, method)
	case route == "":
		writeJSONResponse(w, http.StatusOK, j.status())
	case route == "progress":
		j.stream(w, r)
	case route == "cancel":
		s.cancel(w, j)
	case route == "adapter":
		j.serveTar(w)
	default:
		j.serveFile(w, r, strings.TrimPrefix(route, "adapter/"))
	}
}

func (s *Service) create(w http.ResponseWriter, r *http.Request) {
	cfg, err := decodeJobConfig(http.MaxBytesReader(w, r.Body, maxBody))
	var p *prepared
	if err == nil {
		p, err = prepare(cfg, len(s.ranks.ctxs), &s.bases)
	}
	var refused *configError
	if errors.As(err, &refused) {
		httpError(w, http.StatusBadRequest, "%s", refused.msg)
		return
	} else if err != nil {
		httpError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	s.mu.Lock()
	s.next++
	id := fmt.Sprintf("job-%d", s.next)
	s.mu.Unlock()
	dir := filepath.Join(s.workdir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		httpError(w, http.StatusInternalServerError, "making the job's directory: %v", err)
		return
	}
	j := newJob(id, dir, p)
	s.mu.Lock()
	s.jobs[id] = j
	s.mu.Unlock()
	go func() {
		s.slots <- struct{}{}
		defer func() { <-s.slots }()
		if j.cancel.Load() {
			// Cancelled while queued: nothing trained, nothing to save.
			j.update(func() { j.state = stateCancelled })
			return
		}
		j.run(s.ranks)
	}()
	w.Header().Set("Location", "/jobs/"+id)
	writeJSONResponse(w, http.StatusCreated, map[string]string{"id": id, "state": stateQueued})
}

func (s *Service) list(w http.ResponseWriter) {
	s.mu.Lock()
	jobs := make([]map[string]interface{}, 0, len(s.jobs))
	for i := 1; i <= s.next; i++ {
		if j := s.jobs[fmt.Sprintf("job-%d", i)]; j != nil {
			jobs = append(jobs, j.status())
		}
	}
	s.mu.Unlock()
	writeJSONResponse(w, http.StatusOK, jobs)
}

// stats is GET /stats: what the context holds on rank 0.
func (s *Service) stats(w http.ResponseWriter) {
	st, err := s.ranks.ctxs[0].Stats()
	if err != nil {
		httpError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	writeJSONResponse(w, http.StatusOK, map[string]interface{}{"ranks": len(s.ranks.ctxs), "groups": st.Groups,
		"groups_created": st.GroupsCreated, "channels": st.Channels, "memory_bytes": st.MemoryBytes,
		"shared_memory": st.SharedMemory})
}

func (s *Service) cancel(w http.ResponseWriter, j *Job) {
	j.cancel.Store(true)
	j.mu.Lock()
	state, done := j.state, j.done()
	j.mu.Unlock()
	if done {
		httpError(w, http.StatusConflict, "job %s has already ended: %s", j.ID, state)
		return
	}
	writeJSONResponse(w, http.StatusAccepted, map[string]string{"id": j.ID, "state": state,
		"note": "the job stops after its current step, then saves its checkpoint and adapter"})
}

// status is GET /jobs/{id}: the job's state, description and where its files are.
func (j *Job) status() map[string]interface{} {
	j.mu.Lock()
	defer j.mu.Unlock()
	st := map[string]interface{}{"id": j.ID, "state": j.state, "step": len(j.progress), "steps": j.p.cfg.Steps,
		"config": j.p.cfg, "dir": j.Dir}
	if j.err != "" {
		st["error"] = j.err
	}
	if j.saved {
		st["checkpoint"] = filepath.Join(j.Dir, "checkpoint")
		st["adapter"] = filepath.Join(j.Dir, "adapter")
	}
	if n := len(j.progress); n > 0 {
		st["loss"] = j.progress[n-1].Loss
	}
	return st
}

// stream writes the job's progress as JSON lines, from its first step, as they come,
// flushing each; then a last line with the job's status, once it has ended.
func (j *Job) stream(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	sent := 0
	for {
		j.mu.Lock()
		lines := append([]Progress(nil), j.progress[sent:]...)
		done, changed := j.done(), j.changed
		j.mu.Unlock()
		for _, p := range lines {
			if enc.Encode(p) != nil {
				return
			}
		}
		sent += len(lines)
		if done {
			enc.Encode(j.status())
			if flusher != nil {
				flusher.Flush()
			}
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

// adapterFiles are what sx_export_peft writes: what PeftModel.from_pretrained reads.
var adapterFiles = []string{"adapter_config.json", "adapter_model.safetensors"}

func (j *Job) ready(w http.ResponseWriter) bool {
	j.mu.Lock()
	saved, state := j.saved, j.state
	j.mu.Unlock()
	if !saved {
		httpError(w, http.StatusConflict, "job %s is %s: its adapter is written when it finishes or is cancelled", j.ID, state)
	}
	return saved
}

// serveTar is GET /jobs/{id}/adapter: the adapter directory's files as a tar archive.
func (j *Job) serveTar(w http.ResponseWriter) {
	if !j.ready(w) {
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", j.ID+"-adapter.tar"))
	tw := tar.NewWriter(w)
	for _, name := range adapterFiles {
		b, err := os.ReadFile(filepath.Join(j.Dir, "adapter", name))
		if err != nil {
			return // the status is sent: a truncated archive is what the client sees
		}
		if tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b))}) != nil {
			return
		}
		if _, err := tw.Write(b); err != nil {
			return
		}
	}
	tw.Close()
}

// serveFile is GET /jobs/{id}/adapter/{file} and GET /jobs/{id}/logits.
func (j *Job) serveFile(w http.ResponseWriter, r *http.Request, name string) {
	if !j.ready(w) {
		return
	}
	path := filepath.Join(j.Dir, "adapter", name)
	if name == "logits" {
		path = filepath.Join(j.Dir, "logits.json")
	}
	f, err := os.Open(path)
	if err != nil {
		httpError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	defer f.Close()
	if strings.HasSuffix(path, ".json") {
		w.Header().Set("Content-Type", "application/json")
	} else {
		w.Header().Set("Content-Type", "application/octet-stream")
	}
	io.Copy(w, f)
}

func writeJSONResponse(w http.ResponseWriter, code int, v interface{}) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func httpError(w http.ResponseWriter, code int, format string, args ...interface{}) {
	writeJSONResponse(w, code, map[string]string{"error": fmt.Sprintf(format, args...)})
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	httpError(w, http.StatusMethodNotAllowed, "%s %s: allowed %s", r.Method, r.URL.Path, allow)
}
