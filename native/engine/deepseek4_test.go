package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/gguf/quant"
)

// ds4Config is the shape of a random deepseek4 test model (native/src/arch/deepseek4.h).
type ds4Config struct {
	vocab, embd, heads, headDim, rope int
	qLora, oGroups, oLora, window     int
	ratios                            []int // per layer: 0 window only, 4 CSA, other HCA
	idxHeads, idxDim, topK            int
	experts, used, ffn, hash          int
	clamp                             []float32 // per layer swiglu_clamp_exp
	weight                            gguf.Type
	seed                              uint64
}

// tinyDS4 has every kind of layer (window only, CSA with the indexer, HCA with ratio 8), hash and routed MoE layers,
// a window of 8 and top-k 4, so a 70-token prompt wraps the ring, closes many windows and prunes with the indexer.
// Layer 4's SwiGLU clamp (0.5) fires.
func tinyDS4() ds4Config {
	return ds4Config{vocab: 96, embd: 64, heads: 4, headDim: 32, rope: 16, qLora: 32, oGroups: 2, oLora: 16, window: 8,
		ratios: []int{0, 0, 4, 8, 4, 8}, idxHeads: 32, idxDim: 32, topK: 4, experts: 8, used: 2, ffn: 32, hash: 3,
		clamp: []float32{10, 10, 10, 10, 0.5, 10}, weight: gguf.F32, seed: 11}
}

// ds4Spec draws a deepseek4 model at random with the upstream tensor names and keys.
func ds4Spec(t testing.TB, c ds4Config) ModelSpec {
	t.Helper()
	rng := rand.New(rand.NewPCG(c.seed, 3))
	L := len(c.ratios)
	a := "deepseek4."
	ratios := make([]int32, L)
	for i, r := range c.ratios {
		ratios[i] = int32(r)
	}
	meta := map[string]any{
		a + "block_count": uint32(L), a + "context_length": uint32(1 << 20), a + "embedding_length": uint32(c.embd),
		a + "attention.head_count": uint32(c.heads), a + "attention.head_count_kv": uint32(1),
		a + "attention.key_length": uint32(c.headDim), a + "attention.value_length": uint32(c.headDim),
		a + "attention.layer_norm_rms_epsilon": float32(1e-6), a + "rope.dimension_count": uint32(c.rope),
		a + "rope.freq_base": float32(10000), a + "rope.scaling.type": "yarn", a + "rope.scaling.factor": float32(16),
		a + "rope.scaling.original_context_length": uint32(65536), a + "attention.q_lora_rank": uint32(c.qLora),
		a + "attention.sliding_window": uint32(c.window), a + "expert_count": uint32(c.experts),
		a + "expert_used_count": uint32(c.used), a + "expert_feed_forward_length": uint32(c.ffn),
		a + "expert_shared_count": uint32(1), a + "expert_weights_scale": float32(1.5), a + "expert_weights_norm": true,
		a + "expert_gating_func": uint32(4), a + "swiglu_clamp_exp": c.clamp, a + "swiglu_clamp_shexp": c.clamp,
		a + "attention.indexer.head_count": uint32(c.idxHeads), a + "attention.indexer.key_length": uint32(c.idxDim),
		a + "attention.indexer.top_k": uint32(c.topK), a + "attention.output_group_count": uint32(c.oGroups),
		a + "attention.output_lora_rank": uint32(c.oLora), a + "attention.compress_ratios": ratios,
		a + "attention.compress_rope_freq_base": float32(160000), a + "hyper_connection.count": uint32(4),
		a + "hyper_connection.sinkhorn_iterations": uint32(20), a + "hyper_connection.epsilon": float32(1e-6),
		a + "hash_layer_count": uint32(c.hash),
	}
	var tensors []Tensor
	seed := func() *rand.Rand { return rand.New(rand.NewPCG(rng.Uint64(), uint64(len(tensors)))) }
	draw := func(n int, f func(r *rand.Rand) float64) []float32 {
		r := seed()
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(f(r))
		}
		return v
	}
	vec := func(name string, v []float32, dims ...uint64) {
		tensors = append(tensors, Tensor{Name: name, Type: gguf.F32, Dims: dims, Data: f32Bytes(v)})
	}
	norm := func(name string, n int) {
		vec(name, draw(n, func(r *rand.Rand) float64 { return 1 + r.NormFloat64()*0.1 }), uint64(n))
	}
	small := func(name string, dims ...uint64) {
		n := uint64(1)
		for _, d := range dims {
			n *= d
		}
		vec(name, draw(int(n), normal(0.3)), dims...)
	}
	// mat stores a matrix (or a 3-D stack) as c.weight; f32 keeps the tensors the runtime wants in f32.
	mat := func(name string, std float64, typ gguf.Type, dims ...uint64) {
		n := uint64(1)
		for _, d := range dims {
			n *= d
		}
		v := draw(int(n), normal(std))
		if typ == gguf.F32 {
			tensors = append(tensors, Tensor{Name: name, Type: typ, Dims: dims, Data: f32Bytes(v)})
			return
		}
		b, err := quant.FromFloat32(typ, v)
		if err != nil {
			t.Fatalf("quantize %s: %v", name, err)
		}
		tensors = append(tensors, Tensor{Name: name, Type: typ, Dims: dims, Data: b})
	}
	u := func(x int) uint64 { return uint64(x) }
	D, N, mix, HD := c.embd, 4, 24, c.heads*c.headDim
	w := c.weight
	mat("token_embd.weight", 0.5, w, u(D), u(c.vocab))
	mat("output.weight", 0.1, w, u(D), u(c.vocab))
	norm("output_norm.weight", D)
	mat("output_hc_fn.weight", 0.1, gguf.F32, u(N*D), u(N))
	small("output_hc_base.weight", u(N))
	norm("output_hc_scale.weight", 1)
	for il, ratio := range c.ratios {
		p := fmt.Sprintf("blk.%d.", il)
		for _, site := range []string{"attn", "ffn"} {
			mat(p+"hc_"+site+"_fn.weight", 0.1, gguf.F32, u(N*D), u(mix))
			small(p+"hc_"+site+"_base.weight", u(mix))
			norm(p+"hc_"+site+"_scale.weight", 3)
		}
		norm(p+"attn_norm.weight", D)
		mat(p+"attn_q_a.weight", 0.1, w, u(D), u(c.qLora))
		norm(p+"attn_q_a_norm.weight", c.qLora)
		mat(p+"attn_q_b.weight", 0.1, w, u(c.qLora), u(HD))
		mat(p+"attn_kv.weight", 0.1, w, u(D), u(c.headDim))
		norm(p+"attn_kv_a_norm.weight", c.headDim)
		small(p+"attn_sinks.weight", u(c.heads))
		mat(p+"attn_output_a.weight", 0.1, w, u(HD/c.oGroups), u(c.oGroups*c.oLora))
		mat(p+"attn_output_b.weight", 0.1, w, u(c.oGroups*c.oLora), u(D))
		if ratio > 0 {
			cw := c.headDim
			if ratio == 4 {
				cw *= 2
			}
			small(p+"attn_compressor_ape.weight", u(cw), u(ratio))
			mat(p+"attn_compressor_kv.weight", 0.1, w, u(D), u(cw))
			mat(p+"attn_compressor_gate.weight", 0.3, w, u(D), u(cw))
			norm(p+"attn_compressor_norm.weight", c.headDim)
		}
		if ratio == 4 {
			mat(p+"indexer.attn_q_b.weight", 0.2, w, u(c.qLora), u(c.idxHeads*c.idxDim))
			mat(p+"indexer.proj.weight", 0.2, w, u(D), u(c.idxHeads))
			small(p+"indexer_compressor_ape.weight", u(2*c.idxDim), u(4))
			mat(p+"indexer_compressor_kv.weight", 0.2, w, u(D), u(2*c.idxDim))
			mat(p+"indexer_compressor_gate.weight", 0.3, w, u(D), u(2*c.idxDim))
			norm(p+"indexer_compressor_norm.weight", c.idxDim)
		}
		norm(p+"ffn_norm.weight", D)
		mat(p+"ffn_gate_inp.weight", 0.3, gguf.F32, u(D), u(c.experts))
		if il < c.hash {
			r := seed()
			ids := make([]byte, 0, 4*c.used*c.vocab)
			for v := 0; v < c.vocab; v++ {
				for _, e := range r.Perm(c.experts)[:c.used] {
					ids = append(ids, byte(e), 0, 0, 0)
				}
			}
			tensors = append(tensors, Tensor{Name: p + "ffn_gate_tid2eid.weight", Type: gguf.I32, Dims: []uint64{u(c.used), u(c.vocab)}, Data: ids})
		} else {
			small(p+"exp_probs_b.bias", u(c.experts))
		}
		mat(p+"ffn_gate_exps.weight", 0.2, w, u(D), u(c.ffn), u(c.experts))
		mat(p+"ffn_up_exps.weight", 0.2, w, u(D), u(c.ffn), u(c.experts))
		mat(p+"ffn_down_exps.weight", 0.2, w, u(c.ffn), u(D), u(c.experts))
		mat(p+"ffn_gate_shexp.weight", 0.2, w, u(D), u(c.ffn))
		mat(p+"ffn_up_shexp.weight", 0.2, w, u(D), u(c.ffn))
		mat(p+"ffn_down_shexp.weight", 0.2, w, u(c.ffn), u(D))
	}
	return ModelSpec{Arch: "deepseek4", Meta: meta, Tensors: tensors}
}

// loadDS4 loads spec with extra metadata (the plugin's overrides).
func loadDS4(t testing.TB, lib *Lib, spec ModelSpec, extra map[string]any, opt Options) *Model {
	t.Helper()
	meta := map[string]any{}
	for k, v := range spec.Meta {
		meta[k] = v
	}
	for k, v := range extra {
		meta[k] = v
	}
	spec.Meta = meta
	spec.Options = opt
	return loadSpec(t, lib, spec)
}

func ds4Opts() Options { return Options{KVPoolTokens: 1024, BlockSize: 16, MaxSeqs: 4, Threads: 2} }

// prefillRows runs toks through a new sequence in chunks of `chunk` tokens (0: all at once) and returns every
// token's logits row.
func prefillRows(t testing.TB, m *Model, toks []int32, chunk int) [][]float32 {
	t.Helper()
	s, err := m.NewSeq()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.FreeSeq(s) }()
	if chunk <= 0 {
		chunk = len(toks)
	}
	var rows [][]float32
	for i := 0; i < len(toks); i += chunk {
		part := toks[i:min(i+chunk, len(toks))]
		r, err := m.Forward(one(s, part, LogitsAll))
		if err != nil {
			t.Fatal(err)
		}
		for j := range part {
			rows = append(rows, append([]float32(nil), r.Row(0, j)...))
		}
	}
	return rows
}

func maxDiff(a, b [][]float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d float64
	for i := range a {
		for j := range a[i] {
			d = max(d, math.Abs(float64(a[i][j]-b[i][j])))
		}
	}
	return d
}

// TestDeepseek4PrefillModes: exact prefill is decoding token by token (bitwise); sparse prefill, whole or in
// unaligned chunks, is the same math batched; dense prefill agrees while the indexer keeps every row and differs once
// it prunes.
func TestDeepseek4PrefillModes(t *testing.T) {
	is := is.New(t)
	lib := openCPU(t)
	spec := ds4Spec(t, tinyDS4())
	toks := randomTokens(rand.New(rand.NewPCG(5, 5)), 70, 96)
	exact := loadDS4(t, lib, spec, nil, ds4Opts())
	s, err := exact.NewSeq()
	is.NoErr(err)
	decoded := decodeSteps(t, exact, s, toks)
	is.True(sameBits(prefillRows(t, exact, toks, 0), decoded))
	is.True(sameBits(prefillRows(t, exact, toks, 5), decoded))

	sparse := loadDS4(t, lib, spec, map[string]any{"deepseek4.engine.prefill": "sparse"}, ds4Opts())
	for _, chunk := range []int{0, 5, 4, 8} {
		d := maxDiff(prefillRows(t, sparse, toks, chunk), decoded)
		t.Logf("sparse prefill, chunk %d: max |Δ logit| vs decoding %.3g", chunk, d)
		is.True(d <= 1e-5)
	}

	dense := loadDS4(t, lib, spec, map[string]any{"deepseek4.engine.prefill": "dense"}, ds4Opts())
	rows := prefillRows(t, dense, toks, 0)
	// every visible CSA row is kept while (p + 1) / 4 <= top-k (4): positions below 19
	t.Logf("dense prefill within top-k: max |Δ logit| %.3g", maxDiff(rows[:19], decoded[:19]))
	is.True(maxDiff(rows[:19], decoded[:19]) <= 1e-5)
	d := maxDiff(rows[19:], decoded[19:])
	t.Logf("dense prefill past the indexer's top-k: max |Δ logit| %.3g", d)
	is.True(d > 1e-4) // pruning really is skipped
}

// TestDeepseek4Batched: two sequences in one forward (prefill, then decode steps together) match each alone.
func TestDeepseek4Batched(t *testing.T) {
	is := is.New(t)
	lib := openCPU(t)
	spec := ds4Spec(t, tinyDS4())
	rng := rand.New(rand.NewPCG(6, 6))
	a, b := randomTokens(rng, 37, 96), randomTokens(rng, 23, 96)
	for _, mode := range []string{"exact", "sparse"} {
		t.Run(mode, func(t *testing.T) {
			is := is.New(t)
			m := loadDS4(t, lib, spec, map[string]any{"deepseek4.engine.prefill": mode}, ds4Opts())
			alone := [][][]float32{prefillRows(t, m, a, 0), prefillRows(t, m, b, 0)}
			sa, _ := m.NewSeq()
			sb, _ := m.NewSeq()
			r, err := m.Forward(Batch{Entries: []Entry{{Seq: sa, Tokens: a[:30], Logits: LogitsAll}, {Seq: sb, Tokens: b[:16], Logits: LogitsAll}}})
			is.NoErr(err)
			var got [2][][]float32
			for i := 0; i < 30; i++ {
				got[0] = append(got[0], append([]float32(nil), r.Row(0, i)...))
			}
			for i := 0; i < 16; i++ {
				got[1] = append(got[1], append([]float32(nil), r.Row(1, i)...))
			}
			for i := 0; i < 7; i++ {
				r, err := m.Forward(Batch{Entries: []Entry{{Seq: sa, Tokens: a[30+i : 31+i], Logits: LogitsLast}, {Seq: sb, Tokens: b[16+i : 17+i], Logits: LogitsLast}}})
				is.NoErr(err)
				got[0] = append(got[0], append([]float32(nil), r.Row(0, 0)...))
				got[1] = append(got[1], append([]float32(nil), r.Row(1, 0)...))
			}
			is.True(maxDiff(got[0], alone[0]) <= 1e-5)
			is.True(maxDiff(got[1], alone[1][:23]) <= 1e-5)
		})
	}
	_ = is
}

// nextLogits forwards one token and returns its logits.
func nextLogits(t testing.TB, m *Model, s Seq, tok int32) []float32 {
	t.Helper()
	r, err := m.Forward(one(s, []int32{tok}, LogitsLast))
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), r.Row(0, 0)...)
}

// TestDeepseek4Rollback: snapshot / rollback, and a recorded verify block truncated to every length, give the same
// next logits as a sequence that only ever saw the accepted tokens. The block crosses CSA, HCA and ring boundaries.
func TestDeepseek4Rollback(t *testing.T) {
	lib := openCPU(t)
	spec := ds4Spec(t, tinyDS4())
	rng := rand.New(rand.NewPCG(8, 8))
	prompt, block, next := randomTokens(rng, 29, 96), randomTokens(rng, 11, 96), int32(7)
	for _, mode := range []string{"exact", "sparse"} {
		m := loadDS4(t, lib, spec, map[string]any{"deepseek4.engine.prefill": mode}, ds4Opts())
		for k := 0; k <= len(block); k++ {
			t.Run(fmt.Sprintf("%s/accept%d", mode, k), func(t *testing.T) {
				is := is.New(t)
				ref, _ := m.NewSeq()
				defer func() { _ = m.FreeSeq(ref) }()
				_, err := m.Forward(one(ref, append(append([]int32(nil), prompt...), block[:k]...), LogitsNone))
				is.NoErr(err)
				want := nextLogits(t, m, ref, next)

				s, _ := m.NewSeq()
				defer func() { _ = m.FreeSeq(s) }()
				_, err = m.Forward(one(s, prompt, LogitsNone))
				is.NoErr(err)
				_, err = m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: block, Logits: LogitsAll, Record: true}}})
				is.NoErr(err)
				is.NoErr(m.Truncate(s, len(prompt)+k))
				is.True(maxDiff([][]float32{nextLogits(t, m, s, next)}, [][]float32{want}) <= 1e-5)

				// snapshot before the block, roll back, then feed the accepted tokens
				s2, _ := m.NewSeq()
				defer func() { _ = m.FreeSeq(s2) }()
				_, err = m.Forward(one(s2, prompt, LogitsNone))
				is.NoErr(err)
				is.NoErr(m.Snapshot(s2))
				_, err = m.Forward(one(s2, block, LogitsAll))
				is.NoErr(err)
				is.NoErr(m.Rollback(s2))
				if k > 0 {
					_, err = m.Forward(one(s2, block[:k], LogitsNone))
					is.NoErr(err)
				}
				is.True(maxDiff([][]float32{nextLogits(t, m, s2, next)}, [][]float32{want}) <= 1e-5)
			})
		}
	}
	m := loadDS4(t, lib, spec, nil, ds4Opts())
	is := is.New(t)
	s, _ := m.NewSeq()
	_, err := m.Forward(one(s, prompt, LogitsNone))
	is.NoErr(err)
	is.True(errors.Is(m.Truncate(s, 20), ErrState)) // not recorded
	is.NoErr(m.Truncate(s, 0))
}

// TestDeepseek4ExportImport: a sequence exported and imported into another slot continues identically; damaged or
// foreign blobs are refused.
func TestDeepseek4ExportImport(t *testing.T) {
	is := is.New(t)
	lib := openCPU(t)
	spec := ds4Spec(t, tinyDS4())
	m := loadDS4(t, lib, spec, nil, ds4Opts())
	toks := randomTokens(rand.New(rand.NewPCG(9, 9)), 45, 96)
	s, _ := m.NewSeq()
	_, err := m.Forward(one(s, toks, LogitsNone))
	is.NoErr(err)
	blob, err := m.Export(s)
	is.NoErr(err)
	s2, _ := m.NewSeq()
	is.NoErr(m.Import(s2, blob))
	n, _ := m.SeqLen(s2)
	is.Equal(n, len(toks))
	a, b := decodeSteps(t, m, s, []int32{3, 4, 5, 6, 7, 8, 9, 10}), decodeSteps(t, m, s2, []int32{3, 4, 5, 6, 7, 8, 9, 10})
	is.True(sameBits(a, b))

	bad := append([]byte(nil), blob...)
	bad[len(bad)-3] ^= 1
	s3, _ := m.NewSeq()
	is.True(errors.Is(m.Import(s3, bad), ErrInvalid))
	is.True(errors.Is(m.Import(s3, blob[:len(blob)-4]), ErrInvalid))
	is.True(errors.Is(m.Import(s, blob), ErrState)) // not empty
	other := ds4Config(tinyDS4())
	other.ratios = []int{0, 0, 4, 8, 4, 4}
	m2 := loadDS4(t, lib, ds4Spec(t, other), nil, ds4Opts())
	s4, _ := m2.NewSeq()
	err = m2.Import(s4, blob)
	is.True(errors.Is(err, ErrInvalid))
}

// TestDeepseek4Pool: kv_stats and estimate report the compressed rows and slots; a full pool refuses with ErrNoKV.
func TestDeepseek4Pool(t *testing.T) {
	is := is.New(t)
	lib := openCPU(t)
	spec := ds4Spec(t, tinyDS4())
	m := loadDS4(t, lib, spec, nil, Options{KVPoolTokens: 64, BlockSize: 16, MaxSeqs: 2, Threads: 2})
	info := m.Info()
	c := tinyDS4()
	// per token: CSA layers 2, 4 rows of head_dim + idx_dim every 4 tokens; HCA layers 3, 5 one head_dim row per
	// block (ratio 8 < block 16: 2 rows per block)
	wantKV := uint64(2*(4*(c.headDim+c.idxDim)*4)+2*(2*c.headDim*4)) / 16
	is.Equal(info.KVBytesPerToken, wantKV)
	est, err := lib.Estimate(ModelSpec{Arch: spec.Arch, Meta: spec.Meta, Tensors: spec.Tensors, Options: Options{BlockSize: 16}})
	is.NoErr(err)
	is.Equal(est.KVBytesPerToken, wantKV)
	is.Equal(est.StateBytesPerSeq, info.StateBytesPerSeq)
	is.True(info.StateBytesPerSeq > uint64(6*c.window*c.headDim*4))
	s, _ := m.NewSeq()
	_, err = m.Forward(one(s, randomTokens(rand.New(rand.NewPCG(1, 1)), 60, 96), LogitsNone))
	is.NoErr(err)
	st, _ := m.KVStats()
	is.Equal(st.BlocksFree, 0)
	s2, _ := m.NewSeq()
	_, err = m.Forward(one(s2, []int32{1}, LogitsLast))
	is.True(errors.Is(err, ErrNoKV))
	n, _ := m.SeqLen(s2)
	is.Equal(n, 0)
}

// TestDeepseek4Switches: a lowered expert_used_count changes the output (and more than the trained count is refused
// on hash layers); engine.prefill accepts exact, dense and sparse and names the allowed values otherwise; hidden
// capture is refused clearly; forward_topk agrees with the logits.
func TestDeepseek4Switches(t *testing.T) {
	is := is.New(t)
	lib := openCPU(t)
	spec := ds4Spec(t, tinyDS4())
	toks := randomTokens(rand.New(rand.NewPCG(2, 2)), 30, 96)
	full := prefillRows(t, loadDS4(t, lib, spec, nil, ds4Opts()), toks, 0)
	one := prefillRows(t, loadDS4(t, lib, spec, map[string]any{"deepseek4.expert_used_count": uint32(1)}, ds4Opts()), toks, 0)
	is.True(maxDiff(full, one) > 1e-3)

	for _, tc := range []struct {
		extra map[string]any
		want  string
	}{
		{map[string]any{"deepseek4.engine.prefill": "fast"}, "exact, dense, sparse"},
		{map[string]any{"deepseek4.expert_used_count": uint32(3)}, "exceeds"},
		{map[string]any{"deepseek4.expert_gating_func": uint32(2)}, "expert_gating_func"},
	} {
		meta := map[string]any{}
		for k, v := range spec.Meta {
			meta[k] = v
		}
		for k, v := range tc.extra {
			meta[k] = v
		}
		_, err := lib.LoadModel(ModelSpec{Arch: spec.Arch, Meta: meta, Tensors: spec.Tensors, Options: ds4Opts()})
		is.True(err != nil && strings.Contains(err.Error(), tc.want))
	}

	m := loadDS4(t, lib, spec, nil, ds4Opts())
	s, _ := m.NewSeq()
	_, err := m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: toks, Logits: LogitsLast}}, Capture: []int{1}})
	is.True(errors.Is(err, ErrUnsupported))
	r, err := m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: toks, Logits: LogitsAll}}, TopK: 5})
	is.NoErr(err)
	for i := range toks {
		ids, vals, _, ok := r.Candidates(0, i)
		is.True(ok)
		best := 0
		for j, v := range full[i] {
			if v > full[i][best] {
				best = j
			}
		}
		is.Equal(ids[0], int32(best))
		is.True(math.Abs(float64(vals[0]-full[i][best])) <= 1e-5)
	}
}

// TestDeepseek4LogitsRow: after a TopK forward of two sequences (prefill: token by token or batched; then a decode
// step), LogitsRow gives each caller row the logits a forward of whole rows gives, and nothing past them; the next
// forward drops them.
func TestDeepseek4LogitsRow(t *testing.T) {
	lib := openCPU(t)
	spec := ds4Spec(t, tinyDS4())
	rng := rand.New(rand.NewPCG(8, 8))
	a, b := randomTokens(rng, 21, 96), randomTokens(rng, 9, 96)
	for _, mode := range []string{"exact", "sparse"} {
		t.Run(mode, func(t *testing.T) {
			is := is.New(t)
			m := loadDS4(t, lib, spec, map[string]any{"deepseek4.engine.prefill": mode}, ds4Opts())
			want := [][][]float32{prefillRows(t, m, a, 0), prefillRows(t, m, b, 0)}
			sa, _ := m.NewSeq()
			sb, _ := m.NewSeq()
			row := make([]float32, m.Info().Vocab)
			check := func(wantRows [][]float32) {
				for i, w := range wantRows {
					is.NoErr(m.LogitsRow(i, row))
					is.True(maxDiff([][]float32{row}, [][]float32{w}) == 0) // the row the candidates came from
				}
				is.True(errors.Is(m.LogitsRow(len(wantRows), row), ErrState)) // no such row
			}
			_, err := m.Forward(Batch{TopK: 8, Entries: []Entry{{Seq: sa, Tokens: a[:20], Logits: LogitsLast}, {Seq: sb, Tokens: b[:8], Logits: LogitsAll}}})
			is.NoErr(err)
			check(append([][]float32{want[0][19]}, want[1][:8]...))
			_, err = m.Forward(Batch{TopK: 8, Entries: []Entry{{Seq: sb, Tokens: b[8:9], Logits: LogitsLast}, {Seq: sa, Tokens: a[20:21], Logits: LogitsLast}}})
			is.NoErr(err)
			check([][]float32{want[1][8], want[0][20]})
			sc, _ := m.NewSeq()
			_, err = m.Forward(Batch{Entries: []Entry{{Seq: sc, Tokens: a[:3]}}}) // no logits rows
			is.NoErr(err)
			is.True(errors.Is(m.LogitsRow(0, row), ErrState)) // the next forward dropped them
		})
	}
}
