// sx-finetune: a LoRA fine-tune service over HTTP on loopback. Tenants post jobs (a base
// LlamaForCausalLM from a local directory, a text file, hyperparameters, a LoRA rank);
// every job is an sx group in one context over the service's ranks, goroutines of this
// process, each rank training on its share of every batch. Progress streams as JSON lines;
// a cancelled job stops at a step boundary and saves; the adapter comes out in PEFT's
// format. README.md has the API.
//
// usage: sx-finetune [-addr 127.0.0.1:8080] [-workdir DIR] [-ranks 2] [-max-running 4]
//
//	sx-finetune -run-one job.json -out DIR   (one job, no HTTP: DIR gets what a job's directory does)
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"
)

type options struct {
	addr, workdir, runOne, out string
	ranks, maxRunning, threads int
	timeout                    time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.addr, "addr", "127.0.0.1:8080", "where to serve HTTP: a loopback address (port 0: any free port)")
	flag.StringVar(&o.workdir, "workdir", "", "where the jobs' directories go (default: a new temporary directory)")
	flag.IntVar(&o.ranks, "ranks", 2, "ranks of the context, each a goroutine of this process")
	flag.IntVar(&o.maxRunning, "max-running", 4, "jobs trained at once; more wait in the queue")
	flag.IntVar(&o.threads, "threads", 1, "threads of the context's pool for the optimizer steps")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "how long a collective may wait for the other ranks")
	flag.StringVar(&o.runOne, "run-one", "", "a job description (JSON) to run alone, without HTTP")
	flag.StringVar(&o.out, "out", "", "with -run-one: the directory to create for its results")
	flag.Parse()
	var err error
	if o.runOne != "" {
		err = runOne(o)
	} else {
		err = serve(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sx-finetune:", err)
		os.Exit(1)
	}
}

// serve runs the service until the process is killed.
func serve(o options) error {
	host, _, err := net.SplitHostPort(o.addr)
	if err != nil {
		return fmt.Errorf("-addr %q: %v", o.addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("-addr %q: the service has no authentication and serves on loopback only", o.addr)
	}
	if o.maxRunning < 1 {
		return fmt.Errorf("-max-running must be at least 1, got %d", o.maxRunning)
	}
	if o.workdir == "" {
		if o.workdir, err = os.MkdirTemp("", "sx-finetune-"); err != nil {
			return err
		}
	}
	ranks, err := newRanks(fmt.Sprintf("sx-finetune-%d", os.Getpid()), o.ranks, o.threads, o.timeout)
	if err != nil {
		return err
	}
	defer ranks.Close()
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	// The one line a caller waits for (port 0 chooses the port).
	fmt.Printf("sx-finetune: serving http://%s (%d ranks, jobs in %s)\n", ln.Addr(), o.ranks, o.workdir)
	srv := &http.Server{Handler: newService(ranks, o.workdir, o.maxRunning), ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(ln)
}

// runOne runs one job alone in a context of its own, as the service would, writing its
// checkpoint, adapter, losses.json and logits.json under -out.
func runOne(o options) error {
	if o.out == "" {
		return fmt.Errorf("-run-one needs -out DIR")
	}
	f, err := os.Open(o.runOne)
	if err != nil {
		return err
	}
	cfg, err := decodeJobConfig(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %v", o.runOne, err)
	}
	var bases baseCache
	p, err := prepare(cfg, o.ranks, &bases)
	if err != nil {
		return fmt.Errorf("%s: %v", o.runOne, err)
	}
	if err := os.Mkdir(o.out, 0o755); err != nil {
		return err
	}
	ranks, err := newRanks(fmt.Sprintf("sx-finetune-one-%d", os.Getpid()), o.ranks, o.threads, o.timeout)
	if err != nil {
		return err
	}
	defer ranks.Close()
	j := newJob("job-1", o.out, p)
	j.run(ranks)
	if j.state != stateFinished {
		return fmt.Errorf("the job ended %s: %s", j.state, j.err)
	}
	fmt.Printf("sx-finetune: %d steps, final loss %v, results in %s\n", len(j.progress), j.progress[len(j.progress)-1].Loss, o.out)
	return nil
}
