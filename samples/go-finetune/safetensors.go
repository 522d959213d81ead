package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
)

// A safetensors file (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON naming each tensor's dtype, shape and byte range in
// the data that follows, then the data. Only what a base model needs is read: F32, F16
// and BF16 tensors, widened to float32.

type tensorEntry struct {
	Dtype       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// readSafetensors returns every tensor of the file by name, as float32 with its shape.
func readSafetensors(path string) (map[string][]float32, map[string][]int64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	if len(raw) < 8 {
		return nil, nil, fmt.Errorf("%s: %d bytes, too short for a safetensors header", path, len(raw))
	}
	n := binary.LittleEndian.Uint64(raw[:8])
	if n > uint64(len(raw)-8) {
		return nil, nil, fmt.Errorf("%s: header of %d bytes passes the file's end (%d bytes)", path, n, len(raw))
	}
	var header map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+n], &header); err != nil {
		return nil, nil, fmt.Errorf("%s: header: %v", path, err)
	}
	data := raw[8+n:]
	names := make([]string, 0, len(header))
	for name := range header {
		if name != "__metadata__" {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	values, shapes := map[string][]float32{}, map[string][]int64{}
	for _, name := range names {
		var e tensorEntry
		if err := json.Unmarshal(header[name], &e); err != nil {
			return nil, nil, fmt.Errorf("%s: tensor %q: %v", path, name, err)
		}
		v, err := decodeTensor(e, data)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: tensor %q: %v", path, name, err)
		}
		values[name], shapes[name] = v, e.Shape
	}
	return values, shapes, nil
}

func decodeTensor(e tensorEntry, data []byte) ([]float32, error) {
	numel := int64(1)
	for _, d := range e.Shape {
		if d < 0 {
			return nil, fmt.Errorf("negative dimension in shape %v", e.Shape)
		}
		numel *= d
	}
	size := map[string]int64{"F32": 4, "F16": 2, "BF16": 2}[e.Dtype]
	if size == 0 {
		return nil, fmt.Errorf("dtype %s: only F32, F16 and BF16 are read", e.Dtype)
	}
	if len(e.DataOffsets) != 2 || e.DataOffsets[0] < 0 || e.DataOffsets[1] > int64(len(data)) ||
		e.DataOffsets[1]-e.DataOffsets[0] != numel*size {
		return nil, fmt.Errorf("data_offsets %v do not hold %d %s values within %d bytes of data",
			e.DataOffsets, numel, e.Dtype, len(data))
	}
	b := data[e.DataOffsets[0]:e.DataOffsets[1]]
	out := make([]float32, numel)
	for i := range out {
		switch e.Dtype {
		case "F32":
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		case "BF16":
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
		case "F16":
			out[i] = halfToFloat(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
	return out, nil
}

// halfToFloat widens an IEEE 754 binary16 value exactly.
func halfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | frac<<13)
	case exp == 0 && frac == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: frac * 2^-24
		v := float32(frac) * float32(math.Ldexp(1, -24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
}
