package sx

import (
	"fmt"
	"reflect"
	"testing"
	"unsafe"
)

// GroupConfig.Offload: 2 ranks of a CUDA group on the simulated device
// (SX_SIMULATED_DEVICE=1: host memory behind a device's calls) keep LAMB's state on the
// host (a CUDA group that does not offload keeps it, and runs LAMB, on the device). Two
// steps change the param; the memory stats' DeviceBytes count the params and gradients on
// the device but not the optimizer state (all of it without offload), and are 0 for a
// CPU group.

const offloadRows, offloadCols = 6, 4

// floats is the fp32 elements behind a view: the simulated device's memory is host
// memory, which Param and Grad (host memory only) do not wrap.
func floats(v View) ([]float32, error) {
	if v.Dtype != DtypeF32 || v.Numel != offloadRows*offloadCols {
		return nil, fmt.Errorf("view of %d elements of %v, not %d of f32", v.Numel, v.Dtype, offloadRows*offloadCols)
	}
	return unsafe.Slice((*float32)(v.Data), v.Numel), nil
}

type offloadRun struct {
	before, after []float32
	stats         MemoryStats
	device        int32
}

// trainOffloaded runs 2 ranks of a group of backend with offload: LAMB over one 2-D fp32
// param, two steps.
func trainOffloaded(t *testing.T, name string, backend Backend, offload bool) []offloadRun {
	t.Setenv("SX_SIMULATED_DEVICE", "1") // read when a CUDA group is created
	runs := make([]offloadRun, 2)
	edit := func(c *GroupConfig) { c.Backend, c.Offload = backend, offload }
	runRanksWith(t, name, 2, edit, func(rank int32, g *ShardGroup) error {
		pg := NewParamGroup(Lamb)
		pg.LR = 0.01
		if _, err := g.AddParamGroup(pg); err != nil {
			return err
		}
		if _, err := g.AddParam(Param{Name: "w", Shape: []int64{offloadRows, offloadCols}}); err != nil {
			return err
		}
		if err := g.Finalize(); err != nil {
			return err
		}
		view, err := g.ParamView(0)
		if err != nil {
			return err
		}
		w, err := floats(view)
		if err != nil {
			return err
		}
		for k := range w {
			w[k] = float32(k%7-3) / 8
		}
		run := offloadRun{before: append([]float32(nil), w...), device: view.Device}
		for step := 0; step < 2; step++ {
			gv, err := g.GradView(0)
			if err != nil {
				return err
			}
			dw, err := floats(gv)
			if err != nil {
				return err
			}
			for k := range dw {
				dw[k] = float32((k*5+step+int(rank))%9-4) / 16
			}
			if _, err := g.Step(nil); err != nil {
				return err
			}
		}
		if view, err = g.ParamView(0); err != nil {
			return err
		}
		if w, err = floats(view); err != nil {
			return err
		}
		run.after = append([]float32(nil), w...)
		if run.stats, err = g.MemoryStats(); err != nil {
			return err
		}
		runs[rank] = run
		return nil
	})
	return runs
}

func TestAnOffloadedCUDAGroupStepsLAMBWithItsStateOnTheHost(t *testing.T) {
	runs := trainOffloaded(t, "offload-lamb", BackendCUDA, true)
	for r, run := range runs {
		s := run.stats
		if run.device != DeviceCUDA {
			t.Errorf("rank %d: the param's view is on device %d, not the CUDA device", r, run.device)
		}
		if reflect.DeepEqual(run.before, run.after) {
			t.Errorf("rank %d: two steps left the param as it was", r)
		}
		// The params and their flat gradient buffer (fp32: as large) are on the device;
		// the masters, LAMB's state and the reduced gradient shard are not.
		if s.OptimizerBytes == 0 || s.DeviceBytes == 0 || s.DeviceBytes != 2*s.ParamBytes ||
			s.DeviceBytes >= s.ParamBytes+s.GradBytes+s.OptimizerBytes {
			t.Errorf("rank %d: memory stats %+v: DeviceBytes should be the params and gradients alone", r, s)
		}
	}
	if !reflect.DeepEqual(runs[0].after, runs[1].after) {
		t.Errorf("the ranks' replicated params differ: %v and %v", runs[0].after, runs[1].after)
	}
}

func TestACUDAGroupThatKeepsItsStateOnTheDeviceStepsLAMBThere(t *testing.T) {
	runs := trainOffloaded(t, "offload-none", BackendCUDA, false)
	for r, run := range runs {
		s := run.stats
		if run.device != DeviceCUDA || reflect.DeepEqual(run.before, run.after) {
			t.Errorf("rank %d: device %d, param %v -> %v", r, run.device, run.before, run.after)
		}
		if s.OptimizerBytes == 0 || s.DeviceBytes != s.ParamBytes+s.GradBytes+s.OptimizerBytes {
			t.Errorf("rank %d: memory stats %+v: DeviceBytes should be all of them", r, s)
		}
	}
	if !reflect.DeepEqual(runs[0].after, runs[1].after) {
		t.Errorf("the ranks' replicated params differ: %v and %v", runs[0].after, runs[1].after)
	}
}

func TestACPUGroupHasNoDeviceBytes(t *testing.T) {
	for r, run := range trainOffloaded(t, "offload-cpu", BackendCPU, true) {
		if run.device != DeviceCPU || reflect.DeepEqual(run.before, run.after) {
			t.Errorf("rank %d: device %d, param %v -> %v", r, run.device, run.before, run.after)
		}
		if run.stats.DeviceBytes != 0 || run.stats.ParamBytes == 0 {
			t.Errorf("rank %d: memory stats %+v: a CPU group holds no device memory", r, run.stats)
		}
	}
}
