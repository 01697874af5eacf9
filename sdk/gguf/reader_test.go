package gguf

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matryer/is"
)

func golden(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/golden.gguf")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkGolden asserts the contents of the spec's golden file (§1.10).
func checkGolden(is *is.I, f *File) {
	is.Equal(f.Version(), uint32(3))
	is.Equal(f.Arch(), "llama")
	is.Equal(f.Alignment(), uint64(32))
	is.Equal(f.DataStart(), uint64(0x120))
	n, err := f.Uint32("llama.block_count")
	is.NoErr(err)
	is.Equal(n, uint32(1))
	toks, err := f.Strings("tokenizer.ggml.tokens")
	is.NoErr(err)
	is.Equal(toks, []string{"a", "<s>"})
	is.Equal(f.KVs(), []KV{
		{Key: "general.architecture", Type: ValueString},
		{Key: "llama.block_count", Type: ValueUint32},
		{Key: "tokenizer.ggml.tokens", Type: ValueArray, ElemType: ValueString, Len: 2},
	})
	is.Equal(f.Tensors(), []TensorInfo{
		{Name: "output_norm.weight", Type: F32, Dims: []uint64{4}, Offset: 0x120, Size: 16},
		{Name: "token_embd.weight", Type: F16, Dims: []uint64{2, 3}, Offset: 0x140, Size: 12},
	})
	d, err := f.TensorData("output_norm.weight")
	is.NoErr(err)
	for i := 0; i < 4; i++ {
		is.Equal(math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:])), float32(i+1))
	}
	d, err = f.TensorData("token_embd.weight")
	is.NoErr(err)
	is.Equal(len(d), 12)
	for i := 0; i < 6; i++ {
		is.Equal(binary.LittleEndian.Uint16(d[2*i:]), uint16(0x3C00+i))
	}
	_, err = f.TensorData("nope")
	is.True(err != nil)
}

func TestGoldenParse(t *testing.T) {
	is := is.New(t)
	f, err := Parse(golden(t))
	is.NoErr(err)
	checkGolden(is, f)
}

func TestGoldenOpen(t *testing.T) {
	is := is.New(t)
	f, err := Open("testdata/golden.gguf")
	is.NoErr(err)
	checkGolden(is, f)
	is.NoErr(f.Close())
	is.NoErr(f.Close()) // idempotent
	_, err = f.TensorData("token_embd.weight")
	is.True(err != nil) // closed
	arch, err := ReadArch("testdata/golden.gguf")
	is.NoErr(err)
	is.Equal(arch, "llama")
}

// writeGolden writes the golden file's contents with our writer.
func writeGolden(w *Writer) error {
	if err := w.AddKV("general.architecture", "llama"); err != nil {
		return err
	}
	if err := w.AddKV("llama.block_count", uint32(1)); err != nil {
		return err
	}
	if err := w.AddKV("tokenizer.ggml.tokens", []string{"a", "<s>"}); err != nil {
		return err
	}
	if err := w.AddTensor("output_norm.weight", F32, []uint64{4}); err != nil {
		return err
	}
	if err := w.AddTensor("token_embd.weight", F16, []uint64{2, 3}); err != nil {
		return err
	}
	var norm []byte
	for i := 1; i <= 4; i++ {
		norm = binary.LittleEndian.AppendUint32(norm, math.Float32bits(float32(i)))
	}
	if err := w.WriteTensorData("output_norm.weight", norm); err != nil {
		return err
	}
	err := w.WriteTensor("token_embd.weight", func(tw io.Writer) error {
		for i := 0; i < 6; i++ { // row by row, as a streaming producer would
			if _, err := tw.Write(binary.LittleEndian.AppendUint16(nil, uint16(0x3C00+i))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return w.Close()
}

func TestWriterReproducesGolden(t *testing.T) {
	is := is.New(t)
	var buf bytes.Buffer
	is.NoErr(writeGolden(NewWriter(&buf)))
	is.Equal(buf.Bytes(), golden(t))

	path := filepath.Join(t.TempDir(), "g.gguf")
	w, err := Create(path)
	is.NoErr(err)
	is.NoErr(writeGolden(w))
	b, err := os.ReadFile(path)
	is.NoErr(err)
	is.Equal(b, golden(t))
}

// allValues covers every value type, scalar and array.
var allValues = []struct {
	key string
	val any
	typ string
}{
	{"t.u8", uint8(200), "uint8"},
	{"t.i8", int8(-100), "int8"},
	{"t.u16", uint16(60000), "uint16"},
	{"t.i16", int16(-30000), "int16"},
	{"t.u32", uint32(4000000000), "uint32"},
	{"t.i32", int32(-2000000000), "int32"},
	{"t.f32", float32(1.5e-6), "float32"},
	{"t.bool", true, "bool"},
	{"t.str", "héllo", "string"},
	{"t.u64", uint64(1 << 60), "uint64"},
	{"t.i64", int64(-1 << 60), "int64"},
	{"t.f64", 3.25, "float64"},
	{"t.au8", []uint8{1, 2, 255}, "array[uint8]"},
	{"t.ai8", []int8{-1, 2}, "array[int8]"},
	{"t.au16", []uint16{1, 65535}, "array[uint16]"},
	{"t.ai16", []int16{-5, 5}, "array[int16]"},
	{"t.au32", []uint32{7, 8, 9}, "array[uint32]"},
	{"t.ai32", []int32{11, 11, 10, 0}, "array[int32]"},
	{"t.af32", []float32{0.5, -2}, "array[float32]"},
	{"t.abool", []bool{true, false, true}, "array[bool]"},
	{"t.astr", []string{"", "x", "<|im_end|>"}, "array[string]"},
	{"t.au64", []uint64{1 << 63}, "array[uint64]"},
	{"t.ai64", []int64{-1 << 63}, "array[int64]"},
	{"t.af64", []float64{math.Pi}, "array[float64]"},
	{"t.empty", []string{}, "array[string]"},
}

// allValuesFile writes every value of allValues into a file and parses it.
func allValuesFile(t *testing.T) *File {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, v := range allValues {
		if err := w.AddKV(v.key, v.val); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestMetaRoundTrip(t *testing.T) {
	f := allValuesFile(t)
	kvs := f.KVs()
	for i, v := range allValues {
		t.Run(v.key, func(t *testing.T) {
			is := is.New(t)
			got, ok := f.Meta(v.key)
			is.True(ok)
			is.Equal(got, v.val)
			is.Equal(kvs[i].Key, v.key)
			is.Equal(kvs[i].TypeName(), v.typ)
		})
	}
	_, ok := f.Meta("missing")
	if ok {
		t.Fatal("missing key found")
	}
}

func TestTypedHelpers(t *testing.T) {
	f := allValuesFile(t)
	tests := []struct {
		name string
		get  func() (any, error)
		want any
		err  string
	}{
		{"uint32 from uint8", func() (any, error) { return f.Uint32("t.u8") }, uint32(200), ""},
		{"uint32 from uint64 too big", func() (any, error) { return f.Uint32("t.u64") }, nil, `key "t.u64" value 1152921504606846976 does not fit uint32`},
		{"uint32 from negative", func() (any, error) { return f.Uint32("t.i8") }, nil, `key "t.i8" value -100 does not fit uint32`},
		{"uint32 from string", func() (any, error) { return f.Uint32("t.str") }, nil, `key "t.str" has type string, want uint32`},
		{"uint32 missing", func() (any, error) { return f.Uint32("nope") }, nil, `missing key "nope"`},
		{"int32 from int16", func() (any, error) { return f.Int32("t.i16") }, int32(-30000), ""},
		{"int32 from uint32 too big", func() (any, error) { return f.Int32("t.u32") }, nil, "does not fit int32"},
		{"int64 from int64", func() (any, error) { return f.Int64("t.i64") }, int64(-1 << 60), ""},
		{"uint64 from uint16", func() (any, error) { return f.Uint64("t.u16") }, uint64(60000), ""},
		{"float32 from f64", func() (any, error) { return f.Float32("t.f64") }, float32(3.25), ""},
		{"float32 from int", func() (any, error) { return f.Float32("t.i16") }, float32(-30000), ""},
		{"float32 from bool", func() (any, error) { return f.Float32("t.bool") }, nil, `key "t.bool" has type bool, want float`},
		{"bool", func() (any, error) { return f.Bool("t.bool") }, true, ""},
		{"string from array", func() (any, error) { return f.String("t.astr") }, nil, `key "t.astr" has type array[string], want string`},
		{"strings", func() (any, error) { return f.Strings("t.astr") }, []string{"", "x", "<|im_end|>"}, ""},
		{"strings from int array", func() (any, error) { return f.Strings("t.ai32") }, nil, `key "t.ai32" has type array[int32], want array[string]`},
		{"int32s from uint16s", func() (any, error) { return f.Int32s("t.au16") }, []int32{1, 65535}, ""},
		{"uint32s from int32s", func() (any, error) { return f.Uint32s("t.ai32") }, []uint32{11, 11, 10, 0}, ""},
		{"uint32s negative", func() (any, error) { return f.Uint32s("t.ai8") }, nil, `key "t.ai8" element 0 value -1 does not fit uint32`},
		{"float32s from f64s", func() (any, error) { return f.Float32s("t.af64") }, []float32{math.Pi}, ""},
		{"per-layer scalar", func() (any, error) { return f.PerLayerUint32("t.u16", 3) }, []uint32{60000, 60000, 60000}, ""},
		{"per-layer array", func() (any, error) { return f.PerLayerUint32("t.au32", 3) }, []uint32{7, 8, 9}, ""},
		{"per-layer wrong length", func() (any, error) { return f.PerLayerUint32("t.au32", 2) }, nil, `key "t.au32" has 3 per-layer values, want 2`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			got, err := tc.get()
			if tc.err != "" {
				is.True(err != nil)
				if !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %q does not contain %q", err, tc.err)
				}
				return
			}
			is.NoErr(err)
			is.Equal(got, tc.want)
		})
	}
}

func TestCustomAlignment(t *testing.T) {
	is := is.New(t)
	var buf bytes.Buffer
	w := NewWriter(&buf)
	is.NoErr(w.AddKV("general.architecture", "x"))
	is.NoErr(w.AddKV(KeyAlignment, uint32(64)))
	is.NoErr(w.AddTensor("a", Q8_0, []uint64{32, 3}))
	is.NoErr(w.AddTensor("b", F32, []uint64{5}))
	is.NoErr(w.WriteTensorData("a", bytes.Repeat([]byte{1}, 102)))
	is.NoErr(w.WriteTensorData("b", bytes.Repeat([]byte{2}, 20)))
	is.NoErr(w.Close())
	f, err := Parse(buf.Bytes())
	is.NoErr(err)
	is.Equal(f.Alignment(), uint64(64))
	ts := f.Tensors()
	is.Equal(ts[0].Offset%64, uint64(0))
	is.Equal(ts[1].Offset, ts[0].Offset+128)
	is.Equal(ts[0].Size, uint64(102))
	is.Equal(len(buf.Bytes())%64, 0)
}

// patch returns a copy of b with v written little-endian at off.
func patch(b []byte, off int, v any) []byte {
	c := append([]byte(nil), b...)
	switch x := v.(type) {
	case uint32:
		binary.LittleEndian.PutUint32(c[off:], x)
	case uint64:
		binary.LittleEndian.PutUint64(c[off:], x)
	case byte:
		c[off] = x
	}
	return c
}

// raw builds a file by hand, for layouts our writer refuses to produce.
type raw struct{ bytes.Buffer }

func (r *raw) u32(v uint32) *raw { r.Write(binary.LittleEndian.AppendUint32(nil, v)); return r }
func (r *raw) u64(v uint64) *raw { r.Write(binary.LittleEndian.AppendUint64(nil, v)); return r }
func (r *raw) str(s string) *raw { putString(&r.Buffer, s); return r }
func header(nt, nkv uint64) *raw {
	r := &raw{}
	r.WriteString("GGUF")
	return r.u32(3).u64(nt).u64(nkv)
}

func TestCorruptFiles(t *testing.T) {
	g := golden(t)
	const (
		kv1Type  = 0x34
		kv3Type  = 0x83
		kv3Elem  = 0x87
		kv3Count = 0x8B
		t1Dims   = 0xC1
		t1Ne0    = 0xC5
		t1Type   = 0xCD
		t1Off    = 0xD1
		t2Off    = 0x10A
	)
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "not a GGUF file"},
		{"magic", patch(g, 0, byte('X')), "not a GGUF file"},
		{"version 1", patch(g, 4, uint32(1)), "version 1 is no longer supported"},
		{"version 4", patch(g, 4, uint32(4)), "unsupported GGUF version 4"},
		{"big endian", patch(g, 4, uint32(0x03000000)), "big-endian"},
		{"header truncated", g[:20], "truncated"},
		{"huge tensor count", patch(g, 8, uint64(1<<62)), "tensor count 4611686018427387904 is impossible"},
		{"huge kv count", patch(g, 16, uint64(math.MaxUint64)), "metadata count"},
		{"huge key length", patch(g, 0x18, uint64(1<<40)), "exceeds"},
		{"unknown value type", patch(g, kv1Type, uint32(13)), `key "general.architecture" has unknown value type 13`},
		{"nested array", patch(g, kv3Elem, uint32(9)), `key "tokenizer.ggml.tokens" is a nested array`},
		{"huge array", patch(g, kv3Count, uint64(1<<40)), "array length 1099511627776 exceeds the limit"},
		{"array past end", patch(g, kv3Count, uint64(1<<29)), "cannot fit"},
		{"array string too long", patch(g, kv3Count+8, uint64(1<<20)), `key "tokenizer.ggml.tokens" element 0: string length 1048576`},
		{"too many dims", patch(g, t1Dims, uint32(5)), `tensor "output_norm.weight" has 5 dims`},
		{"removed type", patch(g, t1Type, uint32(4)), `tensor "output_norm.weight": ggml type Q4_2 (4) was removed`},
		{"unknown type", patch(g, t1Type, uint32(99)), `tensor "output_norm.weight": unknown ggml type 99`},
		{"block mismatch", patch(g, t1Type, uint32(Q4_0)), "ne0 = 4 is not a multiple of the Q4_0 block size 32"},
		{"huge dim", patch(g, t1Ne0, uint64(1<<63)), "too large"},
		{"unaligned offset", patch(g, t1Off, uint64(1)), "offset 1 is not a multiple of the alignment 32"},
		{"offset past end", patch(g, t1Off, uint64(0x1000)), `tensor "output_norm.weight" (16 bytes at data offset 4096) extends past the end`},
		{"huge offset", patch(g, t1Off, uint64(math.MaxUint64-31)), "extends past the end"},
		{"overlap", patch(g, t2Off, uint64(0)), "overlap"},
		{"data truncated", g[:0x140], `tensor "token_embd.weight"`},
		{"infos truncated", g[:0xE0], "truncated"},
		{"empty key", header(0, 1).str("").u32(4).u32(1).Bytes(), "is empty"},
		{"binary key", header(0, 1).str("a\x00b").u32(4).u32(1).Bytes(), "not printable ASCII"},
		{"duplicate key", header(0, 2).str("a.b").u32(4).u32(1).str("a.b").u32(4).u32(1).Bytes(), `duplicate metadata key "a.b"`},
		{"alignment type", header(0, 1).str(KeyAlignment).u32(10).u64(64).Bytes(), `key "general.alignment" has type uint64, want uint32`},
		{"alignment value", header(0, 1).str(KeyAlignment).u32(4).u32(48).Bytes(), "not a power of two"},
		{"alignment zero", header(0, 1).str(KeyAlignment).u32(4).u32(0).Bytes(), "not a power of two"},
		{"empty tensor name", header(1, 0).str("").u32(1).u64(4).u32(0).u64(0).Bytes(), "empty name"},
		{"long tensor name", header(1, 0).str(strings.Repeat("n", 64)).u32(1).u64(4).u32(0).u64(0).Bytes(), "64 bytes long"},
		{"duplicate tensor", header(2, 0).str("t").u32(1).u64(1).u32(0).u64(0).str("t").u32(1).u64(1).u32(0).u64(32).Bytes(), `duplicate tensor name "t"`},
		{"overflowing dims", header(1, 0).str("t").u32(4).u64(1 << 31).u64(1 << 31).u64(1 << 31).u64(1).u32(0).u64(0).Bytes(), "overflows"},
		{"string value truncated", header(0, 1).str("k").u32(8).u64(100).Bytes(), `key "k": truncated file: value length 100 exceeds`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			_, err := Parse(tc.data)
			is.True(err != nil)
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestEveryTruncationFails(t *testing.T) {
	g := golden(t)
	// The last tensor's bytes end at 0x14C; the rest is padding.
	for n := 0; n < 0x14C; n++ {
		if _, err := Parse(g[:n]); err == nil {
			t.Fatalf("prefix of %d bytes parsed without error", n)
		}
	}
	if _, err := Parse(g[:0x14C]); err != nil {
		t.Fatalf("file without trailing padding: %v", err)
	}
}

func TestReadArch(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Arch sits before a corrupt tail: ReadArch must not look at it.
	early := header(1, 2).str(KeyArchitecture).u32(8).str("qwen35").str("x").u32(99).Bytes()
	tests := []struct {
		name, path, want, err string
	}{
		{"golden", "testdata/golden.gguf", "llama", ""},
		{"stops early", write("early.gguf", early), "qwen35", ""},
		{"missing file", filepath.Join(dir, "nope.gguf"), "", "failed to detect architecture from " + filepath.Join(dir, "nope.gguf") + ": "},
		{"no arch", write("noarch.gguf", header(0, 1).str("a").u32(4).u32(1).Bytes()), "", "no general.architecture key"},
		{"arch not string", write("int.gguf", header(0, 1).str(KeyArchitecture).u32(4).u32(1).Bytes()), "", `key "general.architecture" has type uint32, want string`},
		{"not gguf", write("text.gguf", []byte("hello world")), "", "not a GGUF file"},
		{"empty", write("empty.gguf", nil), "", "not a GGUF file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			got, err := ReadArch(tc.path)
			if tc.err != "" {
				is.True(err != nil)
				is.True(strings.HasPrefix(err.Error(), "failed to detect architecture from "+tc.path+": "))
				if !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %q does not contain %q", err, tc.err)
				}
				return
			}
			is.NoErr(err)
			is.Equal(got, tc.want)
		})
	}
}

func TestOpenErrors(t *testing.T) {
	is := is.New(t)
	_, err := Open(filepath.Join(t.TempDir(), "missing.gguf"))
	is.True(err != nil)
	p := filepath.Join(t.TempDir(), "bad.gguf")
	is.NoErr(os.WriteFile(p, patch(golden(t), 4, uint32(7)), 0o644))
	_, err = Open(p)
	is.True(err != nil)
	is.True(strings.Contains(err.Error(), p))
	is.True(strings.Contains(err.Error(), "unsupported GGUF version 7"))
}

// TestConcurrentReads: a File is read from many goroutines at once (run
// with -race).
func TestConcurrentReads(t *testing.T) {
	f, err := Open("testdata/golden.gguf")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	done := make(chan error)
	for g := 0; g < 8; g++ {
		go func() {
			for i := 0; i < 100; i++ {
				if _, err := f.Strings("tokenizer.ggml.tokens"); err != nil {
					done <- err
					return
				}
				if _, err := f.TensorData("token_embd.weight"); err != nil {
					done <- err
					return
				}
				_ = f.Arch()
			}
			done <- nil
		}()
	}
	for g := 0; g < 8; g++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
