package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/gguf/quant"
	"github.com/matryer/is"
)

const testTokenizer = "testdata/tok"

// cli runs dflash-model with args and returns its output.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(args, &out)
	return out.String(), err
}

func mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runCLI(t, args...)
	if err != nil {
		t.Fatalf("dflash-model %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func openGGUF(t *testing.T, path string) *gguf.File {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestMkQwen3(t *testing.T) {
	is := is.New(t)
	out := filepath.Join(t.TempDir(), "q3.gguf")
	mustCLI(t, "mk", "qwen3", out, "--tokenizer", testTokenizer, "--type", "f32", "--vocab", "32")
	f := openGGUF(t, out)
	is.Equal(f.Arch(), "qwen3")
	for key, want := range map[string]uint32{
		"qwen3.block_count": 2, "qwen3.embedding_length": 128, "qwen3.feed_forward_length": 256,
		"qwen3.attention.head_count": 4, "qwen3.attention.head_count_kv": 2, "qwen3.attention.key_length": 32,
		"general.file_type": 0,
	} {
		v, ok := f.Meta(key)
		is.True(ok)                // key present
		is.Equal(v.(uint32), want) // stored as uint32, like llama.cpp
	}
	theta, _ := f.Float32("qwen3.rope.freq_base")
	is.Equal(theta, float32(1e6))
	_, quantized := f.Meta("general.quantization_version")
	is.True(!quantized)
	toks, err := f.Strings("tokenizer.ggml.tokens")
	is.NoErr(err)
	is.Equal(len(toks), 32)
	is.Equal(toks[12], "<|im_end|>")
	is.Equal(toks[31], "[PAD31]")
	types, err := f.Int32s("tokenizer.ggml.token_type")
	is.NoErr(err)
	is.Equal(types[31], int32(5))
	tmpl, err := f.String("tokenizer.chat_template")
	is.NoErr(err)
	is.True(strings.Contains(tmpl, "<|im_start|>"))
	is.NoErr(checkLayout(f))
	is.Equal(len(f.Tensors()), 3+2*11)
	emb, _ := f.Tensor("token_embd.weight")
	is.Equal(emb.Dims, []uint64{128, 32})
	is.Equal(emb.Type, gguf.F32)

	// Random weights have the asked-for spread; norms sit around 1.
	data, _ := f.TensorData("blk.1.ffn_up.weight")
	w, err := quant.ToFloat32(gguf.F32, data)
	is.NoErr(err)
	is.True(std(w) > 0.018 && std(w) < 0.022)
	data, _ = f.TensorData("blk.0.attn_norm.weight")
	n, _ := quant.ToFloat32(gguf.F32, data)
	is.True(mean(n) > 0.98 && mean(n) < 1.02)
}

func mean(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v)
	}
	return s / float64(len(x))
}

func std(x []float32) float64 {
	m := mean(x)
	var s float64
	for _, v := range x {
		s += (float64(v) - m) * (float64(v) - m)
	}
	return math.Sqrt(s / float64(len(x)))
}

func TestMkQwen35(t *testing.T) {
	is := is.New(t)
	out := filepath.Join(t.TempDir(), "q35.gguf")
	mustCLI(t, "mk", "qwen35", out, "--tokenizer", testTokenizer+"/tokenizer.json", "--type", "f32", "--mtp", "1")
	f := openGGUF(t, out)
	is.Equal(f.Arch(), "qwen35")
	bc, _ := f.Uint32("qwen35.block_count")
	is.Equal(bc, uint32(9)) // 8 trunk + 1 MTP
	nn, _ := f.Uint32("qwen35.nextn_predict_layers")
	is.Equal(nn, uint32(1))
	sec, err := f.Int32s("qwen35.rope.dimension_sections")
	is.NoErr(err)
	is.Equal(sec, []int32{2, 1, 1, 0})
	rd, _ := f.Uint32("qwen35.rope.dimension_count")
	is.Equal(rd, uint32(8))
	is.NoErr(checkLayout(f))
	for name, dims := range map[string][]uint64{
		"blk.0.attn_qkv.weight":            {128, 2*2*16 + 4*16},
		"blk.0.ssm_conv1d.weight":          {4, 128},
		"blk.0.ssm_a":                      {4},
		"blk.0.ssm_dt.bias":                {4},
		"blk.0.ssm_out.weight":             {64, 128},
		"blk.3.attn_q.weight":              {128, 2 * 4 * 32},
		"blk.3.attn_output.weight":         {128, 128},
		"blk.7.attn_k_norm.weight":         {32},
		"blk.8.nextn.eh_proj.weight":       {256, 128},
		"blk.8.post_attention_norm.weight": {128},
	} {
		ti, ok := f.Tensor(name)
		is.True(ok) // tensor present
		is.Equal(ti.Dims, dims)
	}
	_, ok := f.Tensor("blk.3.ssm_a")
	is.True(!ok) // layer 3 is full attention
	data, _ := f.TensorData("blk.0.ssm_a")
	a, _ := quant.ToFloat32(gguf.F32, data)
	for _, v := range a {
		is.True(v < -0.4 && v > -4.1) // decay rates are −exp(A_log) < 0
	}
}

func TestMkDeterministicAndTyped(t *testing.T) {
	is := is.New(t)
	dir := t.TempDir()
	a, b, c := filepath.Join(dir, "a.gguf"), filepath.Join(dir, "b.gguf"), filepath.Join(dir, "c.gguf")
	args := []string{"mk", "qwen3", "", "--tokenizer", testTokenizer, "--hidden", "256", "--ffn", "256", "--layers", "1", "--type", "q4_K"}
	for _, p := range []string{a, b} {
		args[2] = p
		mustCLI(t, args...)
	}
	args[2] = c
	mustCLI(t, append(args, "--seed", "2")...)
	ba, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	bc, _ := os.ReadFile(c)
	is.True(bytes.Equal(ba, bb))  // same seed, same bytes
	is.True(!bytes.Equal(ba, bc)) // another seed, other weights
	f := openGGUF(t, a)
	want := map[string]gguf.Type{
		"token_embd.weight":        gguf.Q4_K,
		"output.weight":            gguf.Q6_K, // the head keeps more precision
		"blk.0.attn_output.weight": gguf.Q8_0, // 128-wide rows cannot hold 256-blocks
		"blk.0.ffn_down.weight":    gguf.Q4_K,
		"blk.0.attn_norm.weight":   gguf.F32,
	}
	for name, typ := range want {
		ti, _ := f.Tensor(name)
		is.Equal(ti.Type, typ)
	}
	qv, err := f.Uint32("general.quantization_version")
	is.NoErr(err)
	is.Equal(qv, uint32(2))
	ft, _ := f.Uint32("general.file_type")
	is.Equal(ft, uint32(14))
	// Quantized weights decode to the same spread as the f32 ones.
	ti, _ := f.Tensor("blk.0.ffn_up.weight")
	data, _ := f.TensorData(ti.Name)
	w, err := quant.ToFloat32(ti.Type, data)
	is.NoErr(err)
	is.True(std(w) > 0.017 && std(w) < 0.023)
}

// --distinct-rows N: a tensor's first N rows are those of the full draw; every later row repeats one of them byte for
// byte; tensors of at most N rows are untouched.
func TestMkDistinctRows(t *testing.T) {
	is := is.New(t)
	dir := t.TempDir()
	full, fast := filepath.Join(dir, "full.gguf"), filepath.Join(dir, "fast.gguf")
	args := []string{"mk", "qwen3", "", "--tokenizer", testTokenizer, "--hidden", "256", "--ffn", "512", "--layers", "1", "--type", "q4_K"}
	args[2] = full
	mustCLI(t, args...)
	args[2] = fast
	mustCLI(t, append(args, "--distinct-rows", "64")...)
	a, b := openGGUF(t, full), openGGUF(t, fast)
	for _, name := range []string{"blk.0.ffn_up.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight"} {
		ti, _ := a.Tensor(name)
		da, err := a.TensorData(name)
		is.NoErr(err)
		db, err := b.TensorData(name)
		is.NoErr(err)
		n := 1
		for _, d := range ti.Dims[1:] {
			n *= int(d)
		}
		rb := len(da) / n
		if n <= 64 {
			is.True(bytes.Equal(da, db)) // few rows: every row drawn
			continue
		}
		is.True(bytes.Equal(da[:64*rb], db[:64*rb])) // the pool: the full draw's first rows
		for r := 64; r < n; r++ {
			row, found := db[r*rb:(r+1)*rb], false
			for k := 0; k < 64 && !found; k++ {
				found = bytes.Equal(row, db[k*rb:(k+1)*rb])
			}
			is.True(found) // a later row repeats one of the pool's
		}
		is.True(!bytes.Equal(da, db))
	}
}

// --type q4_0: every matrix in Q4_0 (blocks of 32 fit every row), file type MOSTLY_Q4_0.
func TestMkQ4_0(t *testing.T) {
	is := is.New(t)
	out := filepath.Join(t.TempDir(), "q4_0.gguf")
	mustCLI(t, "mk", "qwen3", out, "--tokenizer", testTokenizer, "--hidden", "256", "--ffn", "256", "--layers", "1", "--type", "q4_0")
	f := openGGUF(t, out)
	for name, typ := range map[string]gguf.Type{
		"token_embd.weight":        gguf.Q4_0,
		"output.weight":            gguf.Q4_0,
		"blk.0.attn_output.weight": gguf.Q4_0,
		"blk.0.ffn_down.weight":    gguf.Q4_0,
		"blk.0.attn_norm.weight":   gguf.F32,
	} {
		ti, ok := f.Tensor(name)
		is.True(ok)
		is.Equal(ti.Type, typ)
	}
	ft, _ := f.Uint32("general.file_type")
	is.Equal(ft, uint32(2))
	ti, _ := f.Tensor("blk.0.ffn_up.weight")
	data, _ := f.TensorData(ti.Name)
	w, err := quant.ToFloat32(ti.Type, data)
	is.NoErr(err)
	is.True(std(w) > 0.017 && std(w) < 0.023)
}

func TestMkErrors(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "x.gguf")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown arch", []string{"mk", "llama9", out, "--tokenizer", testTokenizer}, `unknown architecture "llama9"`},
		{"bad type", []string{"mk", "qwen3", out, "--tokenizer", testTokenizer, "--type", "q3_K"}, `unsupported output type "q3_K"`},
		{"no tokenizer", []string{"mk", "qwen3", out, "--tokenizer", filepath.Join(dir, "none")}, "--tokenizer:"},
		{"small vocab", []string{"mk", "qwen3", out, "--tokenizer", testTokenizer, "--vocab", "5"}, "vocab size 5 is smaller than the tokenizer's 14 tokens"},
		{"gqa", []string{"mk", "qwen3", out, "--tokenizer", testTokenizer, "--heads", "6", "--kv-heads", "4"}, "heads (6) must be a multiple of kv-heads (4)"},
		{"negative", []string{"mk", "qwen3", out, "--tokenizer", testTokenizer, "--layers=-1"}, "layers must be positive, got -1"},
		{"preset arch", []string{"mk", "qwen35", out, "--tokenizer", testTokenizer, "--preset", "qwen3-8b"}, `preset "qwen3-8b" is a qwen3 model, not qwen35`},
		{"unknown preset", []string{"mk", "qwen3", out, "--tokenizer", testTokenizer, "--preset", "gpt5"}, `unknown preset "gpt5"`},
		{"experts", []string{"mk", "qwen3", out, "--tokenizer", testTokenizer, "--experts", "8"}, "architecture qwen3 has no experts"},
		{"v heads", []string{"mk", "qwen35", out, "--tokenizer", testTokenizer, "--linear-v-heads", "3"}, "linear-v-heads (3) must be a multiple of linear-k-heads (2)"},
		{"distinct rows", []string{"mk", "qwen3", out, "--tokenizer", testTokenizer, "--distinct-rows=-2"}, "--distinct-rows -2: want 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			_, err := runCLI(t, tc.args...)
			is.True(err != nil)
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			_, statErr := os.Stat(out)
			is.True(os.IsNotExist(statErr)) // nothing half-written
		})
	}
}

// TestPresetShapes checks the full-size plans without writing them.
func TestPresetShapes(t *testing.T) {
	tests := []struct {
		preset  string
		tensors int
		params  float64 // billions
	}{
		{"qwen3-0.6b", 2 + 28*11, 0.596},
		{"qwen3-8b", 3 + 36*11, 8.19},
		{"qwen3-32b", 3 + 64*11, 32.76},
		{"qwen3.5-0.8b", 2 + 18*14 + 6*11, 0.752}, // the text model (the release counts its vision encoder too)
		{"qwen3.5-4b", 2 + 24*14 + 8*11, 4.21},
		{"qwen3.5-27b", 3 + 48*14 + 16*11, 26.9},
		{"qwen3.5-27b-dflash", 58, 1.73},
		{"deepseek-v4-flash", 6 + 43*24 + 41*4 + 21*6, 284},
	}
	for _, tc := range tests {
		t.Run(tc.preset, func(t *testing.T) {
			is := is.New(t)
			p := presets[tc.preset]
			l := layouts[p.arch]
			is.NoErr(l.validate(p.hp))
			plans := l.tensors(p.hp)
			is.Equal(len(plans), tc.tensors)
			var n float64
			for _, pl := range plans {
				e := 1.0
				for _, d := range pl.Dims {
					e *= float64(d)
				}
				n += e
			}
			is.True(n/1e9 > tc.params*0.99 && n/1e9 < tc.params*1.01) // parameter count of the release
		})
	}
}

func TestInspect(t *testing.T) {
	is := is.New(t)
	path := filepath.Join(t.TempDir(), "m.gguf")
	mustCLI(t, "mk", "qwen35", path, "--tokenizer", testTokenizer, "--type", "q8_0", "--hidden", "64", "--layers", "4")
	out := mustCLI(t, "inspect", path, "--template")
	for _, want := range []string{
		"architecture:  qwen35",
		"file type:     MOSTLY_Q8_0 (7)",
		"block_count ", "ssm.time_step_rank ",
		"model gpt2, pre-tokenizer qwen2",
		"tokens 14 (normal 10, control 3, user-defined 1)",
		"merges 3",
		`eos 12 "<|im_end|>"`,
		"{% if add_generation_prompt %}",
		"blk.3.attn_q.weight", "Q8_0",
		"layout check: ok (qwen35)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	out = mustCLI(t, "inspect", path, "--no-tensors")
	is.True(!strings.Contains(out, "blk.3.attn_q.weight"))
}

// TestInspectLayoutMismatch rewrites a generated file without one tensor
// and with a wrong shape: inspect must fail naming both.
func TestInspectLayoutMismatch(t *testing.T) {
	is := is.New(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "m.gguf")
	mustCLI(t, "mk", "qwen3", src, "--tokenizer", testTokenizer, "--type", "f32")
	f := openGGUF(t, src)
	bad := filepath.Join(dir, "bad.gguf")
	w, err := gguf.Create(bad)
	is.NoErr(err)
	for _, kv := range f.KVs() {
		v, _ := f.Meta(kv.Key)
		is.NoErr(w.AddKV(kv.Key, v))
	}
	var keep []gguf.TensorInfo
	for _, ti := range f.Tensors() {
		switch ti.Name {
		case "blk.1.ffn_up.weight":
			continue
		case "blk.0.attn_k_norm.weight":
			ti.Dims = []uint64{16}
			ti.Size = 64
		}
		keep = append(keep, ti)
		is.NoErr(w.AddTensor(ti.Name, ti.Type, ti.Dims))
	}
	is.NoErr(w.AddTensor("rope_freqs.weight", gguf.F32, []uint64{16}))
	for _, ti := range keep {
		d, _ := f.TensorData(ti.Name)
		is.NoErr(w.WriteTensorData(ti.Name, d[:ti.Size]))
	}
	is.NoErr(w.WriteTensorData("rope_freqs.weight", make([]byte, 64)))
	is.NoErr(w.Close())
	out, err := runCLI(t, "inspect", bad)
	is.True(err != nil)
	is.True(strings.Contains(out, `missing tensor "blk.1.ffn_up.weight"`))
	is.True(strings.Contains(out, `tensor "blk.0.attn_k_norm.weight" has dims [16], want [32]`))
	is.True(strings.Contains(out, "1 tensors the qwen3 layout does not use: rope_freqs.weight")) // a note, not an error
	_, err = runCLI(t, "inspect", bad, "--no-check")
	is.NoErr(err)
}
