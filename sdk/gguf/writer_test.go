package gguf

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/matryer/is"
)

func TestWriterErrors(t *testing.T) {
	tests := []struct {
		name string
		run  func(w *Writer) error
		want string
	}{
		{"int value", func(w *Writer) error { return w.AddKV("a.b", 3) }, "has no fixed GGUF width"},
		{"map value", func(w *Writer) error { return w.AddKV("a.b", map[string]int{}) }, `key "a.b": unsupported Go type map[string]int`},
		{"empty key", func(w *Writer) error { return w.AddKV("", "x") }, "empty metadata key"},
		{"binary key", func(w *Writer) error { return w.AddKV("a\nb", "x") }, "not printable ASCII"},
		{"duplicate key", func(w *Writer) error {
			_ = w.AddKV("a", "x")
			return w.AddKV("a", "y")
		}, `duplicate metadata key "a"`},
		{"alignment type", func(w *Writer) error { return w.AddKV(KeyAlignment, uint64(32)) }, "must be a uint32"},
		{"alignment value", func(w *Writer) error { return w.AddKV(KeyAlignment, uint32(24)) }, "not a power of two"},
		{"empty name", func(w *Writer) error { return w.AddTensor("", F32, []uint64{1}) }, "empty tensor name"},
		{"long name", func(w *Writer) error { return w.AddTensor(strings.Repeat("x", 64), F32, []uint64{1}) }, "at most 63 allowed"},
		{"duplicate tensor", func(w *Writer) error {
			_ = w.AddTensor("t", F32, []uint64{1})
			return w.AddTensor("t", F32, []uint64{1})
		}, `duplicate tensor name "t"`},
		{"bad block", func(w *Writer) error { return w.AddTensor("t", Q4_K, []uint64{128, 2}) }, `tensor "t": ne0 = 128 is not a multiple of the Q4_K block size 256`},
		{"removed type", func(w *Writer) error { return w.AddTensor("t", Type(31), []uint64{32}) }, "Q4_0_4_4 (31) was removed"},
		{"five dims", func(w *Writer) error { return w.AddTensor("t", F32, []uint64{1, 1, 1, 1, 1}) }, "5 dims"},
		{"out of order", func(w *Writer) error {
			_ = w.AddTensor("a", F32, []uint64{1})
			_ = w.AddTensor("b", F32, []uint64{1})
			return w.WriteTensorData("b", make([]byte, 4))
		}, `tensor "b" written out of order: the next tensor is "a"`},
		{"undeclared", func(w *Writer) error { return w.WriteTensorData("zz", nil) }, `tensor "zz" was not declared`},
		{"written twice", func(w *Writer) error {
			_ = w.AddTensor("a", F32, []uint64{1})
			_ = w.WriteTensorData("a", make([]byte, 4))
			return w.WriteTensorData("a", make([]byte, 4))
		}, `tensor "a" written twice`},
		{"too short", func(w *Writer) error {
			_ = w.AddTensor("a", F32, []uint64{2})
			return w.WriteTensorData("a", make([]byte, 4))
		}, `write tensor "a": 4 of 8 bytes written`},
		{"too long", func(w *Writer) error {
			_ = w.AddTensor("a", F32, []uint64{1})
			return w.WriteTensorData("a", make([]byte, 8))
		}, "past the tensor's end"},
		{"producer error", func(w *Writer) error {
			_ = w.AddTensor("a", F32, []uint64{1})
			return w.WriteTensor("a", func(io.Writer) error { return errors.New("boom") })
		}, `write tensor "a": boom`},
		{"never written", func(w *Writer) error {
			_ = w.AddTensor("a", F32, []uint64{1})
			return w.Close()
		}, `tensor "a" was declared but never written`},
		{"kv after data", func(w *Writer) error {
			_ = w.AddTensor("a", F32, []uint64{1})
			_ = w.WriteTensorData("a", make([]byte, 4))
			return w.AddKV("late", "x")
		}, "header already written"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			err := tc.run(NewWriter(io.Discard))
			is.True(err != nil)
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestWriterNoTensors(t *testing.T) {
	is := is.New(t)
	var buf bytes.Buffer
	w := NewWriter(&buf)
	is.NoErr(w.AddKV(KeyArchitecture, "qwen3"))
	is.NoErr(w.Close())
	f, err := Parse(buf.Bytes())
	is.NoErr(err)
	is.Equal(f.Arch(), "qwen3")
	is.Equal(len(f.Tensors()), 0)
}

func TestWriterEmptyTensor(t *testing.T) {
	is := is.New(t)
	var buf bytes.Buffer
	w := NewWriter(&buf)
	is.NoErr(w.AddTensor("empty", F16, []uint64{0, 4}))
	is.NoErr(w.AddTensor("one", F32, []uint64{1}))
	is.NoErr(w.WriteTensorData("empty", nil))
	is.NoErr(w.WriteTensorData("one", []byte{0, 0, 128, 63}))
	is.NoErr(w.Close())
	f, err := Parse(buf.Bytes())
	is.NoErr(err)
	ts := f.Tensors()
	is.Equal(ts[0].Size, uint64(0))
	is.Equal(ts[0].Offset, ts[1].Offset) // an empty tensor takes no room
	d, err := f.TensorData("one")
	is.NoErr(err)
	is.Equal(d, []byte{0, 0, 128, 63})
}

func TestTypeTable(t *testing.T) {
	tests := []struct {
		typ        Type
		name       string
		block, siz int
	}{
		{F32, "F32", 1, 4}, {F16, "F16", 1, 2}, {BF16, "BF16", 1, 2},
		{Q4_0, "Q4_0", 32, 18}, {Q4_1, "Q4_1", 32, 20}, {Q5_0, "Q5_0", 32, 22}, {Q5_1, "Q5_1", 32, 24},
		{Q8_0, "Q8_0", 32, 34}, {Q8_1, "Q8_1", 32, 36},
		{Q2_K, "Q2_K", 256, 84}, {Q3_K, "Q3_K", 256, 110}, {Q4_K, "Q4_K", 256, 144},
		{Q5_K, "Q5_K", 256, 176}, {Q6_K, "Q6_K", 256, 210}, {Q8_K, "Q8_K", 256, 292},
		{IQ4_NL, "IQ4_NL", 32, 18}, {IQ4_XS, "IQ4_XS", 256, 136}, {MXFP4, "MXFP4", 32, 17},
		{NVFP4, "NVFP4", 64, 36}, {I8, "I8", 1, 1}, {I64, "I64", 1, 8}, {F64, "F64", 1, 8},
		{Type(4), "Q4_2", 0, 0}, {Type(33), "Q4_0_8_8", 0, 0}, {Type(43), "type(43)", 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			is.Equal(tc.typ.String(), tc.name)
			is.Equal(tc.typ.BlockSize(), tc.block)
			is.Equal(tc.typ.TypeSize(), tc.siz)
			is.Equal(tc.typ.Valid(), tc.block > 0)
			if tc.block > 0 {
				is.Equal(tc.typ.RowSize(uint64(tc.block)*3), uint64(tc.siz)*3)
				p, err := ParseType(strings.ToLower(tc.name))
				is.NoErr(err)
				is.Equal(p, tc.typ)
			} else {
				_, err := ParseType(tc.name)
				is.True(err != nil)
			}
		})
	}
	n, err := TensorBytes(Q6_K, []uint64{512, 3, 2})
	if err != nil || n != 2*210*3*2 {
		t.Fatalf("TensorBytes = %d, %v", n, err)
	}
}
