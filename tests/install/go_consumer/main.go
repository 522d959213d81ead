// A Go program built against an installed sx: the binding finds the header and the
// library through `#cgo pkg-config: sx` (PKG_CONFIG_PATH names the install's
// lib/pkgconfig), with no CGO_CFLAGS or CGO_LDFLAGS. One rank takes one SGD step.
package main

import (
	"fmt"
	"os"

	sx "github.com/sx-runtime/sx/bindings/go"
)

func run() error {
	g, err := sx.NewShardGroup(sx.GroupConfig{Rendezvous: "local://go-install-check", WorldSize: 1, Backend: sx.BackendCPU})
	if err != nil {
		return err
	}
	defer g.Close()
	if _, err := g.AddParamGroup(sx.ParamGroup{Optimizer: sx.SGD, LR: 1}); err != nil {
		return err
	}
	if _, err := g.AddParam(sx.Param{Name: "w", Shape: []int64{3}}); err != nil {
		return err
	}
	if err := g.Finalize(); err != nil {
		return err
	}
	grad, err := g.Grad(0)
	if err != nil {
		return err
	}
	for i := range grad {
		grad[i] = 2
	}
	if _, err := g.Step(nil); err != nil {
		return err
	}
	w, err := g.Param(0)
	if err != nil {
		return err
	}
	if w[0] != -2 || w[2] != -2 {
		return fmt.Errorf("after the step w = %v, expected -2", w)
	}
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "go consumer:", err)
		os.Exit(1)
	}
	fmt.Println("go consumer: trained against the installed sx through pkg-config")
}
