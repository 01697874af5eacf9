package gguf

import (
	"bytes"
	"os"
	"reflect"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the parser: it must return an error or a
// File whose every value and tensor can be read back, never panic. A parsed
// file must also survive a rewrite with our Writer unchanged.
func FuzzParse(f *testing.F) {
	g, err := os.ReadFile("testdata/golden.gguf")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(g)
	f.Add(g[:0x14C])
	f.Add(patch(g, 0x8B, uint64(1<<29)))
	f.Add(patch(g, 0xD1, uint64(1<<40)))
	var all bytes.Buffer
	w := NewWriter(&all)
	for _, v := range allValues {
		if err := w.AddKV(v.key, v.val); err != nil {
			f.Fatal(err)
		}
	}
	_ = w.AddKV(KeyAlignment, uint32(16))
	_ = w.AddTensor("q", Q4_K, []uint64{256, 1})
	_ = w.AddTensor("e", Q8_0, []uint64{0})
	_ = w.AddTensor("s", F32, []uint64{1, 1, 1, 1})
	_ = w.WriteTensorData("q", make([]byte, 144))
	_ = w.WriteTensorData("e", nil)
	_ = w.WriteTensorData("s", []byte{1, 2, 3, 4})
	if err := w.Close(); err != nil {
		f.Fatal(err)
	}
	f.Add(all.Bytes())
	f.Add(header(1, 0).str("t").u32(0).u32(0).u64(0).Bytes())
	f.Add([]byte("GGUF"))

	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			return
		}
		var out bytes.Buffer
		w := NewWriter(&out)
		for _, kv := range p.KVs() {
			v, ok := p.Meta(kv.Key)
			if !ok {
				t.Fatalf("listed key %q has no value", kv.Key)
			}
			if err := w.AddKV(kv.Key, v); err != nil {
				t.Fatalf("rewrite key %q: %v", kv.Key, err)
			}
		}
		for _, ti := range p.Tensors() {
			if err := w.AddTensor(ti.Name, ti.Type, ti.Dims); err != nil {
				t.Fatalf("rewrite tensor %q: %v", ti.Name, err)
			}
		}
		for _, ti := range p.Tensors() {
			d, err := p.TensorData(ti.Name)
			if err != nil {
				t.Fatal(err)
			}
			if uint64(len(d)) != ti.Size || ti.Offset%p.Alignment() != 0 {
				t.Fatalf("tensor %q: %d bytes at %d, info says %d", ti.Name, len(d), ti.Offset, ti.Size)
			}
			if err := w.WriteTensorData(ti.Name, d); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		q, err := Parse(out.Bytes())
		if err != nil {
			t.Fatalf("reparse of rewritten file: %v", err)
		}
		if !reflect.DeepEqual(p.KVs(), q.KVs()) {
			t.Fatalf("metadata changed in rewrite")
		}
		for _, kv := range p.KVs() {
			a, _ := p.Meta(kv.Key)
			b, _ := q.Meta(kv.Key)
			if !reflect.DeepEqual(a, b) && !bothNaN(a, b) {
				t.Fatalf("key %q: %v became %v", kv.Key, a, b)
			}
		}
		if len(p.Tensors()) != len(q.Tensors()) {
			t.Fatal("tensor count changed in rewrite")
		}
		for i, ti := range p.Tensors() {
			tq := q.Tensors()[i]
			if ti.Name != tq.Name || ti.Type != tq.Type || !reflect.DeepEqual(ti.Dims, tq.Dims) || ti.Size != tq.Size {
				t.Fatalf("tensor %q changed in rewrite", ti.Name)
			}
			a, _ := p.TensorData(ti.Name)
			b, _ := q.TensorData(ti.Name)
			if !bytes.Equal(a, b) {
				t.Fatalf("tensor %q data changed in rewrite", ti.Name)
			}
		}
	})
}

// bothNaN reports whether a and b hold NaNs in the same places (NaN != NaN
// defeats DeepEqual on float metadata).
func bothNaN(a, b any) bool {
	return reflect.DeepEqual(fmtNaN(a), fmtNaN(b))
}

func fmtNaN(v any) any {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	_ = w.AddKV("k", v)
	_ = w.Close()
	return buf.Bytes()
}
