package main

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestJobConfigRefusals: every bad description is refused with a message that begins
// with the field at fault (or says what was malformed).
func TestJobConfigRefusals(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data.txt")
	if err := os.WriteFile(data, []byte("hello, world"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{
		`{"base": "` + dir + `", "data": "` + data + `", "lora_rank": 0}`:  "lora_rank:",
		`{"base": "` + dir + `", "data": "` + data + `", "lr": -1}`:        "lr:",
		`{"base": "` + dir + `", "data": "` + data + `", "batch": 3}`:      "batch:",
		`{"base": "` + dir + `", "data": "` + data + `", "steps": 0}`:      "steps:",
		`{"base": "` + dir + `", "data": "` + data + `", "steps": "x"}`:    "steps:",
		`{"base": "` + dir + `", "data": "` + data + `", "lr_max": 1}`:     `unknown field "lr_max"`,
		`{"data": "` + data + `"}`:                                         "base:",
		`{"base": "` + dir + `/nothing", "data": "` + data + `"}`:          "base:",
		`{"base": "` + dir + `", "data": "` + data + `"}`:                  "base:", // no config.json
		`{"base": "` + dir + `"}`:                                          "data:",
		`{"base": `:                                                        "malformed JSON",
		``:                                                                 "malformed JSON",
		`{"base": "` + dir + `"} {}`:                                       "malformed JSON",
		`{"base": "` + dir + `", "data": "` + data + `", "eps": 0}`:        "eps:",
		`{"base": "` + dir + `", "data": "` + data + `", "beta2": 1}`:      "beta1, beta2:",
		`{"base": "` + dir + `", "data": "` + data + `", "lora_alpha": 0}`: "lora_alpha:",
	}
	var bases baseCache
	for body, want := range cases {
		cfg, err := decodeJobConfig(strings.NewReader(body))
		if err == nil {
			_, err = prepare(cfg, 2, &bases)
		}
		if _, ok := err.(*configError); !ok || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s: got %v, want a refusal beginning %q", body, err, want)
		}
	}
}

// TestSafetensorsReader reads F32, BF16 and F16 tensors back, and refuses a truncated file.
func TestSafetensorsReader(t *testing.T) {
	f32 := []float32{1.5, -2, 0.25}
	var data []byte
	for _, v := range f32 {
		data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
	}
	data = binary.LittleEndian.AppendUint16(data, 0x3fc0) // bf16 1.5
	data = binary.LittleEndian.AppendUint16(data, 0xc000) // f16 -2
	data = binary.LittleEndian.AppendUint16(data, 0x0001) // f16 2^-24, subnormal
	header, _ := json.Marshal(map[string]interface{}{
		"a":            map[string]interface{}{"dtype": "F32", "shape": []int{3}, "data_offsets": []int{0, 12}},
		"b":            map[string]interface{}{"dtype": "BF16", "shape": []int{1}, "data_offsets": []int{12, 14}},
		"c":            map[string]interface{}{"dtype": "F16", "shape": []int{2}, "data_offsets": []int{14, 18}},
		"__metadata__": map[string]string{"format": "pt"},
	})
	file := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	file = append(append(file, header...), data...)
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	values, shapes, err := readSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]float32{"a": f32, "b": {1.5}, "c": {-2, float32(math.Ldexp(1, -24))}}
	for name, w := range want {
		if len(values[name]) != len(w) || len(shapes[name]) != 1 {
			t.Fatalf("%s: %v %v", name, values[name], shapes[name])
		}
		for i := range w {
			if values[name][i] != w[i] {
				t.Errorf("%s[%d] = %g, want %g", name, i, values[name][i], w[i])
			}
		}
	}
	if err := os.WriteFile(path, file[:len(file)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readSafetensors(path); err == nil || !strings.Contains(err.Error(), `"c"`) {
		t.Errorf("a truncated file: got %v, want an error naming tensor \"c\"", err)
	}
}
