package safetensors

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matryer/is"
)

func encode(t *testing.T, ts []NewTensor) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func mustFloat(t *testing.T, name, dtype string, shape []int64, v []float32) NewTensor {
	t.Helper()
	nt, err := FromFloat32(name, dtype, shape, v)
	if err != nil {
		t.Fatal(err)
	}
	return nt
}

func TestRoundTrip(t *testing.T) {
	vals := []float32{1, -2, 0.5, 3, 0, 96}
	b := encode(t, []NewTensor{
		mustFloat(t, "a.f32", "F32", []int64{2, 3}, vals),
		mustFloat(t, "b.f16", "F16", []int64{6}, vals),
		mustFloat(t, "c.bf16", "BF16", []int64{3, 1, 2}, vals),
		{Name: "d.i64", DType: "I64", Shape: []int64{2}, Data: []byte{7, 0, 0, 0, 0, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{Name: "e.bool", DType: "BOOL", Shape: []int64{1}, Data: []byte{1}},
	})
	c, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		shape []int64
		want  []float32
		err   string
	}{
		{"a.f32", []int64{2, 3}, vals, ""},
		{"b.f16", []int64{6}, vals, ""},
		{"c.bf16", []int64{3, 1, 2}, vals, ""},
		{"d.i64", []int64{2}, []float32{7, -2}, ""},
		{"e.bool", []int64{1}, nil, `tensor "e.bool" has dtype BOOL; only F32, F16, BF16, F64 and integer tensors can be read as floats`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			tn, ok := c.Tensor(tc.name)
			is.True(ok)
			is.Equal(tn.Shape, tc.shape)
			got, err := tn.Float32()
			if tc.err != "" {
				is.True(err != nil)
				is.Equal(err.Error(), tc.err)
				return
			}
			is.NoErr(err)
			if tc.want != nil {
				is.Equal(got, tc.want)
			}
		})
	}
	is := is.New(t)
	is.Equal(c.Names(), []string{"a.f32", "b.f16", "c.bf16", "d.i64", "e.bool"})
	is.Equal(c.Metadata()["format"], "pt")
	row := make([]float32, 3)
	a, _ := c.Tensor("a.f32")
	is.NoErr(a.ReadFloat32(3, row))
	is.Equal(row, vals[3:])
	is.True(a.ReadFloat32(4, row) != nil) // past the end
}

func TestCorrupt(t *testing.T) {
	good := encode(t, []NewTensor{mustFloat(t, "w", "F32", []int64{2}, []float32{1, 2})})
	hdr := func(json string, data int) []byte {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(json)))
		return append(append(b, json...), make([]byte, data)...)
	}
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"short", good[:4], "too short"},
		{"huge header", binary.LittleEndian.AppendUint64(nil, 1<<40), "exceeds the 104857600-byte limit"},
		{"header past end", good[:20], "exceeds the 12 bytes after it"},
		{"bad json", hdr(`{"w":`, 0), "header:"},
		{"unknown dtype", hdr(`{"w":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}}`, 1), `tensor "w": unknown dtype "F7"`},
		{"offsets outside", hdr(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 2), `tensor "w": data_offsets [0, 4] outside the 2 data bytes`},
		{"reversed offsets", hdr(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}`, 8), "outside"},
		{"size mismatch", hdr(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8), `tensor "w": 8 bytes for shape [3] of F32, want 12`},
		{"negative dim", hdr(`{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}`, 0), "negative dimension"},
		{"huge shape", hdr(`{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, 0), "too large"},
		{"one offset", hdr(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}}`, 4), "want 2"},
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

func TestOpenFolder(t *testing.T) {
	dir := t.TempDir()
	is := is.New(t)
	is.NoErr(WriteFile(filepath.Join(dir, "model-00001-of-00002.safetensors"), []NewTensor{mustFloat(t, "a", "F32", []int64{1}, []float32{1})}, nil))
	is.NoErr(WriteFile(filepath.Join(dir, "model-00002-of-00002.safetensors"), []NewTensor{mustFloat(t, "b", "BF16", []int64{1}, []float32{2})}, nil))

	c, err := Open(dir) // no index: every shard
	is.NoErr(err)
	is.Equal(c.Names(), []string{"a", "b"})
	is.NoErr(c.Close())

	index := `{"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}}`
	is.NoErr(os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(index), 0o644))
	_, err = Open(dir)
	is.True(err != nil)
	is.True(strings.Contains(err.Error(), `tensor "c" listed in model.safetensors.index.json is missing`))

	c, err = Open(filepath.Join(dir, "model-00002-of-00002.safetensors"))
	is.NoErr(err)
	b, _ := c.Tensor("b")
	v, err := b.Float32()
	is.NoErr(err)
	is.Equal(v, []float32{2})
	is.NoErr(c.Close())

	_, err = Open(t.TempDir())
	is.True(err != nil)
	is.True(strings.Contains(err.Error(), "no .safetensors files"))
}

func FuzzParse(f *testing.F) {
	var buf bytes.Buffer
	nt, _ := FromFloat32("w", "F16", []int64{2, 2}, []float32{1, 2, 3, 4})
	_ = Write(&buf, []NewTensor{nt}, map[string]string{"k": "v"})
	f.Add(buf.Bytes())
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			return
		}
		for _, n := range c.Names() {
			tn, _ := c.Tensor(n)
			if _, ok := floatSizes[tn.DType]; ok {
				if _, err := tn.Float32(); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
