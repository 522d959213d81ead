package sx

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A group's params exported as a Hugging Face checkpoint (under a name map, in two
// files) and imported into another group come back equal; a checkpoint without one of
// the params is refused naming it, the report says which, and nothing changes; a PEFT
// adapter holds the named params and its config.
func TestHFExportImportAndPEFT(t *testing.T) {
	dir := t.TempDir()
	make := func(tag string) *ShardGroup {
		g, err := NewShardGroup(config(rendezvous("hf-"+tag), 0, 1))
		if err != nil {
			t.Fatal(err)
		}
		if err := wholeSetup(g); err != nil {
			t.Fatal(err)
		}
		return g
	}
	a := make("a")
	defer a.Close()
	if err := wholeTrain(a, 2, 1); err != nil {
		t.Fatal(err)
	}
	names := []NamePair{{"w", "model.w"}, {"b", "model.b"}, {"s", "model.s"}, {"n", "model.n"}}
	out := filepath.Join(dir, "hf")
	if err := a.ExportHF(out, HFExportOptions{Names: names, MaxShardBytes: 200}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "model.safetensors.index.json")); err != nil {
		t.Fatalf("no index: %v", err)
	}
	b := make("b")
	defer b.Close()
	report, err := b.ImportHF(out, HFImportOptions{Names: names})
	if err != nil || report.Loaded != wholeParams || len(report.Missing)+len(report.Unexpected) != 0 {
		t.Fatalf("import: %v %+v", err, report)
	}
	for i := int32(0); i < wholeParams; i++ {
		x, _ := a.Param(i)
		y, _ := b.Param(i)
		for k := range x {
			if x[k] != y[k] {
				t.Fatalf("param %d element %d: %v after import, %v exported", i, k, y[k], x[k])
			}
		}
	}
	// Only "w" under its key: the other params are missing, named, and nothing changes.
	partial := filepath.Join(dir, "partial")
	if err := a.ExportHF(partial, HFExportOptions{Names: names[:1], OnlyNamed: true}); err != nil {
		t.Fatal(err)
	}
	c := make("c")
	defer c.Close()
	before, _ := c.Param(0)
	before = append([]float32(nil), before...)
	report, err = c.ImportHF(partial, HFImportOptions{Names: names})
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrNotFound || !strings.Contains(e.Message, `"b" (key "model.b")`) {
		t.Fatalf("a partial checkpoint: %v", err)
	}
	if len(report.Missing) != 3 || report.Missing[0] != (NamePair{"b", "model.b"}) {
		t.Fatalf("report: %+v", report)
	}
	after, _ := c.Param(0)
	for k := range before {
		if before[k] != after[k] {
			t.Fatal("a refused import changed a param")
		}
	}
	adapter := filepath.Join(dir, "adapter")
	err = a.ExportPEFT(adapter, HFExportOptions{Names: names[1:2], DType: DtypeBF16},
		PEFTConfig{TargetModules: []string{"q_proj"}, R: 4, LoraAlpha: 8, Extra: map[string]interface{}{"modules_to_save": nil}})
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(adapter, "adapter_config.json"))
	if err != nil || !strings.Contains(string(text), `"target_modules":["q_proj"]`) || !strings.Contains(string(text), `"modules_to_save":null`) {
		t.Fatalf("adapter_config.json: %s %v", text, err)
	}
}
