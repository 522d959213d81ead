package sx

import (
	"encoding/json"
	"os"
	"testing"
)

type layoutFile struct {
	Version     []int `json:"version"`
	PointerSize int   `json:"pointer_size"`
	Structs     map[string]struct {
		Size   uintptr `json:"size"`
		Align  uintptr `json:"align"`
		Fields []struct {
			Name   string  `json:"name"`
			Offset uintptr `json:"offset"`
			Size   uintptr `json:"size"`
		} `json:"fields"`
	} `json:"structs"`
	Constants map[string]int64 `json:"constants"`
	Functions []string         `json:"functions"`
}

func readLayout(t *testing.T) layoutFile {
	path := os.Getenv("SX_LAYOUT_JSON")
	if path == "" {
		t.Fatal("set SX_LAYOUT_JSON to build/<dir>/bindings/sx_layout.json (the build writes it)")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var l layoutFile
	if err := json.Unmarshal(data, &l); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return l
}

func TestStructLayoutMatchesHeader(t *testing.T) {
	l := readLayout(t)
	seen := map[string]bool{}
	for _, s := range cLayouts() {
		seen[s.name] = true
		want, ok := l.Structs[s.name]
		if !ok {
			t.Errorf("%s: known to the binding but absent from sx_layout.json", s.name)
			continue
		}
		if s.size != want.Size || s.align != want.Align {
			t.Errorf("%s: size %d align %d here, %d and %d in sx_layout.json", s.name, s.size, s.align, want.Size, want.Align)
		}
		if len(s.fields) != len(want.Fields) {
			t.Errorf("%s: %d fields here, %d in sx_layout.json", s.name, len(s.fields), len(want.Fields))
			continue
		}
		for i, f := range s.fields {
			w := want.Fields[i]
			if f.name != w.Name || f.offset != w.Offset || f.size != w.Size {
				t.Errorf("%s field %d: %s at %d (%d bytes) here, %s at %d (%d bytes) in sx_layout.json",
					s.name, i, f.name, f.offset, f.size, w.Name, w.Offset, w.Size)
			}
		}
	}
	for name := range l.Structs {
		if !seen[name] {
			t.Errorf("%s: in sx_layout.json but unknown to the binding", name)
		}
	}
}

func TestConstantsMatchHeader(t *testing.T) {
	l := readLayout(t)
	ours := map[string]int64{
		"SX_VERSION_MAJOR": VersionMajor, "SX_VERSION_MINOR": VersionMinor, "SX_VERSION_PATCH": VersionPatch,
		"SX_VERSION_NUMBER": VersionNumber,
		"SX_OK":             OK, "SX_ERR_INVALID_ARGUMENT": ErrInvalidArgument, "SX_ERR_INVALID_HANDLE": ErrInvalidHandle,
		"SX_ERR_INVALID_STATE": ErrInvalidState, "SX_ERR_OUT_OF_MEMORY": ErrOutOfMemory, "SX_ERR_NOT_FOUND": ErrNotFound,
		"SX_ERR_ALREADY_EXISTS": ErrAlreadyExists, "SX_ERR_UNSUPPORTED": ErrUnsupported, "SX_ERR_TIMEOUT": ErrTimeout,
		"SX_ERR_COMM": ErrComm, "SX_ERR_GROUP_FAILED": ErrGroupFailed, "SX_ERR_IO": ErrIO, "SX_ERR_CORRUPT": ErrCorrupt,
		"SX_ERR_VERSION": ErrVersion, "SX_ERR_ABORTED": ErrAborted, "SX_ERR_MISMATCH": ErrMismatch,
		"SX_ERR_INTERNAL": ErrInternal, "SX_ERR_CANCELLED": ErrCancelled, "SX_ERR_NONFINITE": ErrNonFinite,
		"SX_ERR_OPTIMIZER": ErrOptimizer, "SX_OPTIM_CUSTOM_FIRST": int64(OptimCustomFirst), "SX_HP_CUSTOM": int64(HPCustom),
		"SX_MAX_CUSTOM_SLOTS": MaxCustomSlots, "SX_MAX_CUSTOM_HYPERPARAMETERS": MaxCustomHyperparameters,
		"SX_MAX_CUSTOM_OPTIMIZERS": MaxCustomOptimizers, "SX_OPTIMIZER_IN_PLACE": OptimizerInPlace,
		"SX_OPTIMIZER_ERROR_BYTES": OptimizerErrorBytes, "SX_LOG_ERROR": LogError, "SX_LOG_WARN": LogWarn,
		"SX_LOG_INFO": LogInfo, "SX_LOG_DEBUG": LogDebug,
		"SX_DTYPE_F32": int64(DtypeF32), "SX_DTYPE_F16": int64(DtypeF16), "SX_DTYPE_BF16": int64(DtypeBF16),
		"SX_DTYPE_U8":     int64(DtypeU8),
		"SX_BACKEND_AUTO": int64(BackendAuto), "SX_BACKEND_CPU": int64(BackendCPU), "SX_BACKEND_CUDA": int64(BackendCUDA),
		"SX_DEVICE_CPU": DeviceCPU, "SX_DEVICE_CUDA": DeviceCUDA,
		"SX_OFFLOAD_NONE": OffloadNone, "SX_OFFLOAD_STATE": OffloadState,
		"SX_OPTIM_SGD": int64(SGD), "SX_OPTIM_ADAM": int64(Adam), "SX_OPTIM_ADAMW": int64(AdamW),
		"SX_OPTIM_ADAGRAD": int64(Adagrad), "SX_OPTIM_RMSPROP": int64(RMSprop), "SX_OPTIM_ADAMAX": int64(Adamax),
		"SX_OPTIM_NADAM": int64(NAdam), "SX_OPTIM_RADAM": int64(RAdam), "SX_OPTIM_LION": int64(Lion), "SX_OPTIM_LAMB": int64(Lamb),
		"SX_OPTIM_MUON": int64(Muon), "SX_OPTIM_ADAFACTOR": int64(Adafactor), "SX_OPTIM_ADEMAMIX": int64(AdEMAMix), "SX_HP_LR": int64(HPLR), "SX_HP_WEIGHT_DECAY": int64(HPWeightDecay), "SX_HP_BETA1": int64(HPBeta1),
		"SX_HP_BETA2": int64(HPBeta2), "SX_HP_EPS": int64(HPEps), "SX_HP_MOMENTUM": int64(HPMomentum),
		"SX_HP_DAMPENING": int64(HPDampening), "SX_HP_NESTEROV": int64(HPNesterov), "SX_HP_MAXIMIZE": int64(HPMaximize),
		"SX_HP_AMSGRAD":  int64(HPAmsgrad),
		"SX_HP_LR_DECAY": int64(HPLRDecay), "SX_HP_INITIAL_ACCUMULATOR_VALUE": int64(HPInitialAccumulatorValue),
		"SX_HP_ALPHA": int64(HPAlpha), "SX_HP_CENTERED": int64(HPCentered), "SX_HP_MOMENTUM_DECAY": int64(HPMomentumDecay),
		"SX_HP_DECOUPLED_WEIGHT_DECAY": int64(HPDecoupledWeightDecay), "SX_HP_NS_A": int64(HPNSA), "SX_HP_NS_B": int64(HPNSB),
		"SX_HP_NS_C": int64(HPNSC), "SX_HP_NS_STEPS": int64(HPNSSteps), "SX_HP_ADJUST_LR": int64(HPAdjustLR),
		"SX_HP_BETA2_DECAY": int64(HPBeta2Decay), "SX_HP_EPS2": int64(HPEps2), "SX_HP_D": int64(HPD), "SX_HP_BETA3": int64(HPBeta3), "SX_HP_T_ALPHA_BETA3": int64(HPTAlphaBeta3),
		"SX_HP_STATE_DTYPE": int64(HPStateDtype), "SX_STATE_FP32": int64(StateDtypeFP32),
		"SX_STATE_BF16": int64(StateDtypeBF16), "SX_STATE_8BIT": int64(StateDtype8Bit), "SX_HP_BF16_STOCHASTIC_ROUND": int64(HPBF16StochasticRound),
		"SX_MUON_ADJUST_LR_ORIGINAL": int64(MuonAdjustLROriginal), "SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW": int64(MuonAdjustLRMatchRMSAdamW),
		"SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED": int64(MuonAdjustLRSpectralUnclamped),
		"SX_GROUP_NO_TRAINABLE_AUTODETECT":     GroupFlagNoTrainableAutodetect,
		"SX_GROUP_RESERVE_CHECKPOINT_STAGING":  GroupFlagReserveCheckpointStaging,
		"SX_GROUP_JOIN":                        GroupFlagJoin,
		"SX_GROUP_MEMORY_COPY_WAIT":            GroupFlagMemoryCopyWait,
		"SX_GROUP_OPENMP_THREADS":              GroupFlagOpenMPThreads,
		"SX_MAX_NDIM":                          MaxNdim, "SX_MAX_NAME_BYTES": MaxNameBytes, "SX_MAX_WORLD_SIZE": MaxWorldSize,
		"SX_LOAD_PARAMS_ONLY": LoadParamsOnly, "SX_LOAD_ALLOW_MISSING": LoadAllowMissing, "SX_LOAD_ALLOW_EXTRA": LoadAllowExtra,
		"SX_LOSS_SCALING_NONE": int64(LossScalingNone), "SX_LOSS_SCALING_DYNAMIC": int64(LossScalingDynamic),
		"SX_LOSS_SCALING_STATIC": int64(LossScalingStatic),
		"SX_NONFINITE_DEFAULT":   int64(NonFiniteDefault), "SX_NONFINITE_SKIP": int64(NonFiniteSkip),
		"SX_NONFINITE_ERROR": int64(NonFiniteError),
		"SX_REDUCE_SUM":      int64(ReduceSum), "SX_REDUCE_MEAN": int64(ReduceMean), "SX_REDUCE_MAX": int64(ReduceMax),
		"SX_REDUCE_MIN": int64(ReduceMin), "SX_MAX_ALL_REDUCE": MaxAllReduce,
		"SX_PREFETCH_NONE":   int64(PrefetchNone),
		"SX_PLACEMENT_WHOLE": int64(PlacementWhole), "SX_PLACEMENT_REPLICATED": int64(PlacementReplicated),
		"SX_PLACEMENT_SPLIT": int64(PlacementSplit),
		"SX_TRANSPORT_AUTO":  int64(TransportAuto), "SX_TRANSPORT_TCP": int64(TransportTCP),
	}
	for name, v := range ours {
		w, ok := l.Constants[name]
		if !ok {
			t.Errorf("%s is defined by the binding but not in sx.h", name)
		} else if w != v {
			t.Errorf("%s is %d in the binding, %d in sx.h", name, v, w)
		}
	}
	for name := range l.Constants {
		if _, ok := ours[name]; !ok {
			t.Errorf("%s is defined in sx.h but not by the binding", name)
		}
	}
	if len(l.Version) < 2 || l.Version[0] != VersionMajor || l.Version[1] != VersionMinor {
		t.Errorf("sx_layout.json is for version %v; the binding for %d.%d", l.Version, VersionMajor, VersionMinor)
	}
}

func TestVersionCheck(t *testing.T) {
	if err := CheckVersion(); err != nil {
		t.Fatal(err)
	}
	if err := checkRuntimeVersion(VersionMajor, VersionMinor+3, 0); err != nil {
		t.Errorf("a newer minor version was refused: %v", err)
	}
	err := checkRuntimeVersion(VersionMajor+1, 0, 0)
	if e, ok := err.(*Error); !ok || e.Status != ErrVersion {
		t.Errorf("another major version was accepted or gave %v", err)
	}
	if VersionMinor > 0 && checkRuntimeVersion(VersionMajor, VersionMinor-1, 0) == nil {
		t.Error("an older minor version was accepted")
	}
}
