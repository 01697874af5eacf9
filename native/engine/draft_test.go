package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/matryer/is"
)

// draftConfig is a tiny random DFlash draft: layer 0 sliding (window), the others full.
type draftConfig struct {
	vocab, embd, ff, layers, feat int
	heads, headsKV, headDim       int
	theta                         float64
	window                        int
	causal                        *int    // dflash.attention.causal; nil: absent
	logitScale, softcap           float64 // 0: absent
	seed                          uint64
	// DFlash2 (convK > 0): conv kernel size, channels per conv group, selector rank and top-k
	convK, convGroup, selRank, selTopK int
}

// tinyDraft2 is a tiny DFlash2 draft: block size 8, sliding layer non-causal as the published drafts.
func tinyDraft2() draftConfig {
	c := tinyDraft()
	zero := 0
	c.causal = &zero
	c.convK, c.convGroup, c.selRank, c.selTopK = 2, 16, 24, 4
	return c
}

func tinyDraft() draftConfig {
	return draftConfig{vocab: 200, embd: 64, ff: 96, layers: 2, feat: 96, heads: 4, headsKV: 2, headDim: 16,
		theta: 1e6, window: 5, seed: 11}
}

func (c draftConfig) sliding(il int) bool { return c.window > 0 && il == 0 }

// randomDraftSpec builds the canonical draft spec (meta keys and tensors as the Go side hands them to the engine),
// f32 weights drawn at random; the target's embedding table and head are part of it.
func randomDraftSpec(c draftConfig) ModelSpec {
	rng := rand.New(rand.NewPCG(c.seed, 3))
	pattern := make([]int32, c.layers)
	for il := range pattern {
		if c.sliding(il) {
			pattern[il] = 1
		}
	}
	meta := map[string]any{
		"dflash.block_count":                      uint32(c.layers),
		"dflash.embedding_length":                 uint32(c.embd),
		"dflash.feed_forward_length":              uint32(c.ff),
		"dflash.attention.head_count":             uint32(c.heads),
		"dflash.attention.head_count_kv":          uint32(c.headsKV),
		"dflash.attention.key_length":             uint32(c.headDim),
		"dflash.attention.layer_norm_rms_epsilon": float32(1e-6),
		"dflash.rope.freq_base":                   float32(c.theta),
		"dflash.context_length":                   uint32(4096),
	}
	if c.window > 0 {
		meta["dflash.attention.sliding_window"] = uint32(c.window)
		meta["dflash.attention.sliding_window_pattern"] = pattern
	}
	if c.causal != nil {
		meta["dflash.attention.causal"] = int32(*c.causal)
	}
	if c.logitScale != 0 {
		meta["dflash.logit_scale"] = float32(c.logitScale)
	}
	if c.softcap != 0 {
		meta["dflash.final_logit_softcapping"] = float32(c.softcap)
	}
	if c.convK > 0 {
		meta["dflash.block_size"] = uint32(8)
		meta["dflash.conv_kernel_size"] = uint32(c.convK)
		meta["dflash.conv_group_size"] = uint32(c.convGroup)
		meta["dflash.selector_rank"] = uint32(c.selRank)
		meta["dflash.selector_top_k"] = uint32(c.selTopK)
	}
	var tensors []Tensor
	add := func(name string, std, mean float64, dims ...uint64) {
		n := 1
		for _, d := range dims {
			n *= int(d)
		}
		b := make([]byte, 4*n)
		for i := 0; i < n; i++ {
			u := math.Float32bits(float32(mean + rng.NormFloat64()*std))
			b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		}
		tensors = append(tensors, Tensor{Name: name, Type: gguf.F32, Dims: dims, Data: b})
	}
	mat := func(name string, in, out int, std float64) { add(name, std, 0, uint64(in), uint64(out)) }
	norm := func(name string, n int) { add(name, 0.1, 1, uint64(n)) }
	qd, kvd := c.heads*c.headDim, c.headsKV*c.headDim
	mat("fc.weight", c.feat, c.embd, 0.1)
	norm("enc.output_norm.weight", c.embd)
	norm("output_norm.weight", c.embd)
	mat("token_embd.weight", c.embd, c.vocab, 0.5)
	mat("output.weight", c.embd, c.vocab, 0.3)
	for il := 0; il < c.layers; il++ {
		p := fmt.Sprintf("blk.%d.", il)
		norm(p+"attn_norm.weight", c.embd)
		norm(p+"ffn_norm.weight", c.embd)
		norm(p+"attn_q_norm.weight", c.headDim)
		norm(p+"attn_k_norm.weight", c.headDim)
		mat(p+"attn_q.weight", c.embd, qd, 0.3)
		mat(p+"attn_k.weight", c.embd, kvd, 0.3)
		mat(p+"attn_v.weight", c.embd, kvd, 0.3)
		mat(p+"attn_output.weight", qd, c.embd, 0.1)
		mat(p+"ffn_gate.weight", c.embd, c.ff, 0.1)
		mat(p+"ffn_up.weight", c.embd, c.ff, 0.1)
		mat(p+"ffn_down.weight", c.ff, c.embd, 0.1)
		if c.convK > 0 {
			proj := 2 * c.convK * (c.embd / c.convGroup)
			for _, s := range []string{"attn", "ffn"} {
				add(p+s+"_conv_base", 0.3, 0.5, uint64(c.embd), uint64(c.convK), 2)
				mat(p+s+"_conv_proj.weight", c.embd, proj, 0.1)
			}
		}
	}
	if c.convK > 0 {
		mat("selector_predecessor.weight", c.selRank, c.vocab, 0.5)
		mat("selector_successor.weight", c.selRank, c.vocab, 0.5)
		mat("selector_hidden.weight", c.embd, c.selRank, 0.3)
	}
	return ModelSpec{Arch: "dflash", Meta: meta, Tensors: tensors,
		Options: Options{KVPoolTokens: 512, BlockSize: 8, MaxSeqs: 6, CacheK: CacheF32, CacheV: CacheF32}}
}

func loadDraft(t *testing.T, lib *Lib, c draftConfig) (*Model, ModelSpec) {
	t.Helper()
	spec := randomDraftSpec(c)
	m, err := lib.LoadModel(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m, spec
}

// ---- float64 reference of the draft (steps 1-3 of the design, plain loops) ----

type refDraft struct {
	c draftConfig
	w map[string][]float32
	// hidden holds the final normed hidden states of the last step's block rows 1.. (the selector's input)
	hidden [][]float64
}

// refSeq is one sequence's context K/V: [layer][position][kv head * head_dim].
type refSeq struct{ K, V [][][]float64 }

func newRefDraft(c draftConfig, spec ModelSpec) *refDraft {
	r := &refDraft{c: c, w: map[string][]float32{}}
	for _, t := range spec.Tensors {
		v := make([]float32, len(t.Data)/4)
		for i := range v {
			d := t.Data[4*i:]
			v[i] = math.Float32frombits(uint32(d[0]) | uint32(d[1])<<8 | uint32(d[2])<<16 | uint32(d[3])<<24)
		}
		r.w[t.Name] = v
	}
	return r
}

func (r *refDraft) newSeq() *refSeq {
	return &refSeq{K: make([][][]float64, r.c.layers), V: make([][][]float64, r.c.layers)}
}

// mv is W x for a ggml {in, out} matrix.
func (r *refDraft) mv(name string, x []float64) []float64 {
	w := r.w[name]
	in := len(x)
	y := make([]float64, len(w)/in)
	for o := range y {
		var s float64
		for i, xi := range x {
			s += float64(w[o*in+i]) * xi
		}
		y[o] = s
	}
	return y
}

func (r *refDraft) rmsnorm(x []float64, name string) []float64 {
	w := r.w[name]
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	k := 1 / math.Sqrt(ss/float64(len(x))+1e-6)
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = v * k * float64(w[i])
	}
	return y
}

// headNormRope normalises every head of x with the named weight and rotates it (NeoX, full head) to position pos.
func (r *refDraft) headNormRope(x []float64, name string, pos int) []float64 {
	hd := r.c.headDim
	out := make([]float64, 0, len(x))
	for h := 0; h < len(x)/hd; h++ {
		v := r.rmsnorm(x[h*hd:(h+1)*hd], name)
		for i := 0; i < hd/2; i++ {
			ang := float64(pos) * math.Pow(r.c.theta, -float64(2*i)/float64(hd))
			c, s := math.Cos(ang), math.Sin(ang)
			x0, x1 := v[i], v[i+hd/2]
			v[i], v[i+hd/2] = x0*c-x1*s, x1*c+x0*s
		}
		out = append(out, v...)
	}
	return out
}

func f64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// sees is the attention mask of a block row at position p over key position k (the block ends before `end`).
func (r *refDraft) sees(il, p, k, end int) bool {
	if k >= end {
		return false
	}
	if !r.c.sliding(il) {
		return true
	}
	causal := r.c.causal == nil || *r.c.causal != 0
	if causal {
		return k <= p && p-k < r.c.window
	}
	return p-k < r.c.window && k-p < r.c.window
}

// step appends the context rows (features [rows][feat]) to s and returns the logits of block rows 1.. .
func (r *refDraft) step(s *refSeq, feats []float32, block []int32) [][]float64 {
	c := r.c
	for j := 0; j < len(feats)/c.feat; j++ {
		g := r.rmsnorm(r.mv("fc.weight", f64(feats[j*c.feat:(j+1)*c.feat])), "enc.output_norm.weight")
		for il := 0; il < c.layers; il++ {
			p := fmt.Sprintf("blk.%d.", il)
			pos := len(s.K[il])
			s.K[il] = append(s.K[il], r.headNormRope(r.mv(p+"attn_k.weight", g), p+"attn_k_norm.weight", pos))
			s.V[il] = append(s.V[il], r.mv(p+"attn_v.weight", g))
		}
	}
	if len(block) < 2 {
		return nil
	}
	base, nb, hd := len(s.K[0]), len(block), c.headDim
	emb := r.w["token_embd.weight"]
	h := make([][]float64, nb)
	for i, tok := range block {
		h[i] = f64(emb[int(tok)*c.embd : (int(tok)+1)*c.embd])
	}
	for il := 0; il < c.layers; il++ {
		p := fmt.Sprintf("blk.%d.", il)
		K := append([][]float64{}, s.K[il]...)
		V := append([][]float64{}, s.V[il]...)
		Q := make([][]float64, nb)
		hn := make([][]float64, nb)
		for i := range h {
			hn[i] = r.rmsnorm(h[i], p+"attn_norm.weight")
		}
		var dyn [][]float64
		if c.convK > 0 {
			dyn = r.rows(p+"attn_conv_proj.weight", hn)
			hn = r.conv(hn, dyn, p+"attn_conv_base", 0)
		}
		for i := range h {
			Q[i] = r.headNormRope(r.mv(p+"attn_q.weight", hn[i]), p+"attn_q_norm.weight", base+i)
			K = append(K, r.headNormRope(r.mv(p+"attn_k.weight", hn[i]), p+"attn_k_norm.weight", base+i))
			V = append(V, r.mv(p+"attn_v.weight", hn[i]))
		}
		o := make([][]float64, nb)
		for i := range h {
			att := make([]float64, c.heads*hd)
			for hh := 0; hh < c.heads; hh++ {
				g := hh / (c.heads / c.headsKV)
				w := make([]float64, len(K))
				mx := math.Inf(-1)
				for k := range K {
					if !r.sees(il, base+i, k, base+nb) {
						continue
					}
					var d float64
					for e := 0; e < hd; e++ {
						d += Q[i][hh*hd+e] * K[k][g*hd+e]
					}
					w[k] = d / math.Sqrt(float64(hd))
					mx = math.Max(mx, w[k])
				}
				var z float64
				for k := range K {
					if r.sees(il, base+i, k, base+nb) {
						w[k] = math.Exp(w[k] - mx)
						z += w[k]
					} else {
						w[k] = 0
					}
				}
				for k := range K {
					for e := 0; e < hd; e++ {
						att[hh*hd+e] += w[k] / z * V[k][g*hd+e]
					}
				}
			}
			o[i] = r.mv(p+"attn_output.weight", att)
		}
		if c.convK > 0 {
			o = r.conv(o, dyn, p+"attn_conv_base", 1)
		}
		hf := make([][]float64, nb)
		for i := range h {
			for e := range h[i] {
				h[i][e] += o[i][e]
			}
			hf[i] = r.rmsnorm(h[i], p+"ffn_norm.weight")
		}
		if c.convK > 0 {
			dyn = r.rows(p+"ffn_conv_proj.weight", hf)
			hf = r.conv(hf, dyn, p+"ffn_conv_base", 0)
		}
		d := make([][]float64, nb)
		for i := range h {
			gate, up := r.mv(p+"ffn_gate.weight", hf[i]), r.mv(p+"ffn_up.weight", hf[i])
			for e := range gate {
				gate[e] = gate[e] / (1 + math.Exp(-gate[e])) * up[e]
			}
			d[i] = r.mv(p+"ffn_down.weight", gate)
		}
		if c.convK > 0 {
			d = r.conv(d, dyn, p+"ffn_conv_base", 1)
		}
		for i := range h {
			for e := range h[i] {
				h[i][e] += d[i][e]
			}
		}
	}
	var out [][]float64
	r.hidden = nil
	for i := 1; i < nb; i++ {
		hn := r.rmsnorm(h[i], "output_norm.weight")
		r.hidden = append(r.hidden, hn)
		l := r.mv("output.weight", hn)
		for v := range l {
			if c.logitScale != 0 {
				l[v] *= c.logitScale
			}
			if c.softcap > 0 {
				l[v] = c.softcap * math.Tanh(l[v]/c.softcap)
			}
		}
		out = append(out, l)
	}
	return out
}

// rows is W x for every row of xs.
func (r *refDraft) rows(name string, xs [][]float64) [][]float64 {
	out := make([][]float64, len(xs))
	for i, x := range xs {
		out[i] = r.mv(name, x)
	}
	return out
}

// conv is one side of DFlash2's grouped dynamic causal convolution over the block rows (spec §5.1 (a)):
// y[i][c] = sum_{t <= min(K-1, i)} (base[side][t][c] + dyn[i][side][t][c / group]) x[i-t][c].
func (r *refDraft) conv(x, dyn [][]float64, baseName string, side int) [][]float64 {
	c := r.c
	H, K, ng := c.embd, c.convK, c.embd/c.convGroup
	base := r.w[baseName]
	y := make([][]float64, len(x))
	for i := range x {
		y[i] = make([]float64, H)
		for t := 0; t < K && t <= i; t++ {
			for ch := 0; ch < H; ch++ {
				w := float64(base[side*K*H+t*H+ch]) + dyn[i][side*K*ng+t*ng+ch/c.convGroup]
				y[i][ch] += w * x[i-t][ch]
			}
		}
	}
	return y
}

// trans is the selector's transition scores of the last step's block rows (spec §5.1 (b)) for the candidate ids
// cands[row][k]: trans[row][i][j] = <pred[a_i] * g_row, succ[cands[row][j]]>, a_i = cands[row-1][i] or the root.
func (r *refDraft) trans(root int32, cands [][]int32) [][][]float64 {
	rank := r.c.selRank
	pred, succ := r.w["selector_predecessor.weight"], r.w["selector_successor.weight"]
	out := make([][][]float64, len(cands))
	for row, cs := range cands {
		g := r.mv("selector_hidden.weight", r.hidden[row])
		out[row] = make([][]float64, len(cs))
		for i := range cs {
			a := root
			if row > 0 {
				a = cands[row-1][i]
			}
			out[row][i] = make([]float64, len(cs))
			for j, b := range cs {
				var sum float64
				for q := 0; q < rank; q++ {
					sum += float64(pred[int(a)*rank+q]) * g[q] * float64(succ[int(b)*rank+q])
				}
				out[row][i][j] = sum
			}
		}
	}
	return out
}

func randomFeatures(rng *rand.Rand, rows, feat int) []float32 {
	out := make([]float32, rows*feat)
	for i := range out {
		out[i] = float32(rng.NormFloat64())
	}
	return out
}

// checkRows compares a draft result's rows of entry e with reference logits: top-1, every candidate's logit, lse.
func checkRows(t *testing.T, what string, res *Result, e int, want [][]float64) {
	t.Helper()
	for i, row := range want {
		ids, logits, lse, ok := res.Candidates(e, i)
		if !ok {
			t.Fatalf("%s: entry %d has no row %d", what, e, i)
		}
		best, z, mx := 0, 0.0, math.Inf(-1)
		for v, x := range row {
			if x > row[best] {
				best = v
			}
			mx = math.Max(mx, x)
		}
		for _, x := range row {
			z += math.Exp(x - mx)
		}
		if int(ids[0]) != best {
			t.Errorf("%s: entry %d row %d: top-1 %d, reference %d", what, e, i, ids[0], best)
		}
		for j, id := range ids {
			if d := math.Abs(float64(logits[j]) - row[id]); d > 1e-4*math.Max(1, math.Abs(row[id])) {
				t.Errorf("%s: entry %d row %d candidate %d (id %d): logit %g, reference %g", what, e, i, j, id, logits[j], row[id])
			}
		}
		if d := math.Abs(float64(lse) - (mx + math.Log(z))); d > 1e-4*math.Max(1, math.Abs(mx)) {
			t.Errorf("%s: entry %d row %d: lse %g, reference %g", what, e, i, lse, mx+math.Log(z))
		}
	}
}

func TestDraftMatchesReference(t *testing.T) {
	lib := openCPU(t)
	zero := 0
	cases := []struct {
		name string
		cfg  func(*draftConfig)
	}{
		{"sliding causal + full", func(*draftConfig) {}},
		{"sliding both ways + full", func(c *draftConfig) { c.causal = &zero }},
		{"no sliding, logit scale and softcap", func(c *draftConfig) { c.window, c.logitScale, c.softcap = 0, 1.5, 3 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			c := tinyDraft()
			tc.cfg(&c)
			m, spec := loadDraft(t, lib, c)
			is.Equal(m.Info().Arch, "dflash")
			is.Equal(m.Info().DraftFeatures, c.feat)
			is.Equal(m.Info().Vocab, c.vocab)
			ref := newRefDraft(c, spec)
			rng := rand.New(rand.NewPCG(5, 6))
			a, b := must(m.NewSeq()), must(m.NewSeq())
			ra, rb := ref.newSeq(), ref.newSeq()
			// two steps: the second sees the cache the first kept (and not its block)
			steps := []struct{ ctxA, blkA, ctxB, blkB int }{{7, 6, 13, 4}, {3, 5, 1, 8}}
			for si, st := range steps {
				fa, fb := randomFeatures(rng, st.ctxA, c.feat), randomFeatures(rng, st.ctxB, c.feat)
				ba, bb := randomTokens(rng, st.blkA, c.vocab), randomTokens(rng, st.blkB, c.vocab)
				res, err := m.DraftForward([]DraftEntry{{Seq: a, Features: fa, Block: ba}, {Seq: b, Features: fb, Block: bb}}, 8)
				is.NoErr(err)
				is.Equal(len(res.LSE), st.blkA-1+st.blkB-1)
				checkRows(t, fmt.Sprintf("step %d", si), res, 0, ref.step(ra, fa, ba))
				checkRows(t, fmt.Sprintf("step %d", si), res, 1, ref.step(rb, fb, bb))
				is.Equal(must(m.SeqLen(a)), len(ra.K[0]))
				is.Equal(must(m.SeqLen(b)), len(rb.K[0]))
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Context fed in pieces (with blocks in between) leaves the same cache as context fed at once: the blocks are not
// kept, and a later block sees the same keys.
func TestDraftContextInPieces(t *testing.T) {
	is := is.New(t)
	c := tinyDraft()
	m, _ := loadDraft(t, openCPU(t), c)
	rng := rand.New(rand.NewPCG(8, 9))
	feats := randomFeatures(rng, 12, c.feat)
	block := randomTokens(rng, 6, c.vocab)

	whole := must(m.NewSeq())
	want, err := m.DraftForward([]DraftEntry{{Seq: whole, Features: feats, Block: block}}, 16)
	is.NoErr(err)

	pieces := must(m.NewSeq())
	for _, cut := range [][2]int{{0, 5}, {5, 9}, {9, 11}} {
		_, err := m.DraftForward([]DraftEntry{{Seq: pieces, Features: feats[cut[0]*c.feat : cut[1]*c.feat],
			Block: randomTokens(rng, 4, c.vocab)}}, 4)
		is.NoErr(err)
		is.Equal(must(m.SeqLen(pieces)), cut[1])
	}
	_, err = m.DraftForward([]DraftEntry{{Seq: pieces, Features: feats[11*c.feat:]}}, 1) // context only, no block
	is.NoErr(err)
	got, err := m.DraftForward([]DraftEntry{{Seq: pieces, Block: block}}, 16)
	is.NoErr(err)
	is.Equal(must(m.SeqLen(pieces)), 12)
	is.Equal(got.IDs, want.IDs)
	if e := relErr(got.Logits, want.Logits); e > 1e-5 {
		t.Errorf("pieces vs whole: rel err %g", e)
	}
	if e := relErr(got.LSE, want.LSE); e > 1e-5 {
		t.Errorf("pieces vs whole lse: rel err %g", e)
	}
}

// A draft whose k|v and gate|up products run as one matrix each (the GPU lays them out so; DFLASH_CPU_FUSE=1 makes the
// CPU do it) gives the bits of the parts multiplied apart: context rows over two steps, then block rows.
func TestDraftFusedEqualsApart(t *testing.T) {
	lib := openCPU(t)
	for _, c := range []draftConfig{tinyDraft(), tinyDraft2()} {
		t.Run(fmt.Sprintf("conv%d", c.convK), func(t *testing.T) {
			is := is.New(t)
			spec := randomDraftSpec(c)
			apart, err := lib.LoadModel(spec)
			is.NoErr(err)
			defer apart.Close()
			t.Setenv("DFLASH_CPU_FUSE", "1")
			fused, err := lib.LoadModel(spec)
			t.Setenv("DFLASH_CPU_FUSE", "0")
			is.NoErr(err)
			defer fused.Close()
			rng := rand.New(rand.NewPCG(21, 22))
			steps := []DraftEntry{
				{Features: randomFeatures(rng, 6, c.feat)},
				{Features: randomFeatures(rng, 3, c.feat), Block: randomTokens(rng, 7, c.vocab)},
			}
			run := func(m *Model) *Result {
				s := must(m.NewSeq())
				var r *Result
				for _, e := range steps {
					e.Seq = s
					r, err = m.DraftForward([]DraftEntry{e}, 4)
					is.NoErr(err)
				}
				return r
			}
			want, got := run(apart), run(fused)
			for row := 0; row < 6; row++ {
				wi, wl, wlse, ok := want.Candidates(0, row)
				is.True(ok)
				gi, gl, glse, _ := got.Candidates(0, row)
				is.Equal(gi, wi)
				is.Equal(append(gl, glse), append(wl, wlse)) // bit for bit
			}
		})
	}
}

func TestDraftBatchedEqualsAlone(t *testing.T) {
	is := is.New(t)
	c := tinyDraft()
	m, _ := loadDraft(t, openCPU(t), c)
	rng := rand.New(rand.NewPCG(10, 11))
	type part struct {
		feats []float32
		block []int32
	}
	parts := []part{
		{randomFeatures(rng, 9, c.feat), randomTokens(rng, 5, c.vocab)},
		{randomFeatures(rng, 2, c.feat), randomTokens(rng, 1, c.vocab)}, // one block token: no rows
		{nil, nil}, // nothing at all
		{randomFeatures(rng, 20, c.feat), randomTokens(rng, 7, c.vocab)},
	}
	var batch []DraftEntry
	for _, p := range parts {
		batch = append(batch, DraftEntry{Seq: must(m.NewSeq()), Features: p.feats, Block: p.block})
	}
	res, err := m.DraftForward(batch, 5)
	is.NoErr(err)
	is.Equal(len(res.LSE), 4+6)
	for i, p := range parts {
		s := must(m.NewSeq())
		alone, err := m.DraftForward([]DraftEntry{{Seq: s, Features: p.feats, Block: p.block}}, 5)
		is.NoErr(err)
		for r := 0; r < len(p.block)-1; r++ {
			ids, logits, lse, ok := res.Candidates(i, r)
			is.True(ok)
			aids, alogits, alse, _ := alone.Candidates(0, r)
			is.Equal(ids, aids)
			if e := relErr(append(logits, lse), append(alogits, alse)); e > 1e-5 {
				t.Errorf("entry %d row %d: batched vs alone rel err %g", i, r, e)
			}
		}
		_, _, _, ok := res.Candidates(i, max(len(p.block)-1, 0))
		is.True(!ok)
		is.NoErr(m.FreeSeq(s))
	}
}

func TestDraftErrors(t *testing.T) {
	lib := openCPU(t)
	c := tinyDraft()
	m, _ := loadDraft(t, lib, c)
	s := must(m.NewSeq())
	feats := randomFeatures(rand.New(rand.NewPCG(1, 2)), 3, c.feat)
	calls := []struct {
		name    string
		entries []DraftEntry
		k       int
		want    string
	}{
		{"feature length", []DraftEntry{{Seq: s, Features: feats[:c.feat+1], Block: []int32{1, 2}}}, 4, "feature floats"},
		{"k zero", []DraftEntry{{Seq: s, Features: feats, Block: []int32{1, 2}}}, 0, "top-k"},
		{"k too large", []DraftEntry{{Seq: s, Block: []int32{1, 2}}}, MaxTopK + 1, "top-k"},
		{"token outside vocabulary", []DraftEntry{{Seq: s, Features: feats, Block: []int32{1, int32(c.vocab)}}}, 4, "vocabulary"},
		{"sequence twice", []DraftEntry{{Seq: s, Features: feats}, {Seq: s, Block: []int32{1, 2}}}, 4, "twice"},
		{"unknown sequence", []DraftEntry{{Seq: 5, Block: []int32{1, 2}}}, 4, "sequence"},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			_, err := m.DraftForward(tc.entries, tc.k)
			is.True(err != nil)
			is.True(strings.Contains(err.Error(), tc.want)) // the message names the culprit
			is.Equal(must(m.SeqLen(s)), 0)                  // nothing changed
		})
	}

	t.Run("forward on a draft", func(t *testing.T) {
		is := is.New(t)
		_, err := m.Forward(one(s, []int32{1}, LogitsLast))
		is.True(errors.Is(err, ErrUnsupported))
		is.True(strings.Contains(err.Error(), "draft_forward"))
	})
	t.Run("draft step on a target", func(t *testing.T) {
		is := is.New(t)
		q := loadRandom(t, lib, tinyQwen3(), Options{KVPoolTokens: 64})
		_, err := q.DraftForward([]DraftEntry{{Seq: 0, Block: []int32{1, 2}}}, 4)
		is.True(err != nil)
	})

	loads := []struct {
		name string
		edit func(*ModelSpec)
		want string
	}{
		{"missing tensor", func(s *ModelSpec) { drop(s, "blk.1.attn_k_norm.weight") }, "blk.1.attn_k_norm.weight"},
		{"missing fc", func(s *ModelSpec) { drop(s, "fc.weight") }, "fc.weight"},
		{"missing head", func(s *ModelSpec) { drop(s, "output.weight") }, "output.weight"},
		{"wrong shape", func(s *ModelSpec) {
			for i := range s.Tensors {
				if s.Tensors[i].Name == "blk.0.attn_q.weight" {
					s.Tensors[i].Dims = []uint64{uint64(c.embd), 32}
					s.Tensors[i].Data = s.Tensors[i].Data[:4*c.embd*32]
				}
			}
		}, "blk.0.attn_q.weight"},
		{"missing rope base", func(s *ModelSpec) { delete(s.Meta, "dflash.rope.freq_base") }, "dflash.rope.freq_base"},
		{"pattern length", func(s *ModelSpec) { s.Meta["dflash.attention.sliding_window_pattern"] = []int32{1} },
			"sliding_window_pattern"},
	}
	for _, tc := range loads {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			spec := randomDraftSpec(c)
			tc.edit(&spec)
			_, err := lib.LoadModel(spec)
			is.True(errors.Is(err, ErrInvalid))
			is.True(strings.Contains(err.Error(), tc.want))
		})
	}
}

func drop(s *ModelSpec, name string) {
	for i, t := range s.Tensors {
		if t.Name == name {
			s.Tensors = append(s.Tensors[:i], s.Tensors[i+1:]...)
			return
		}
	}
}

func TestDraftEstimateAndSequences(t *testing.T) {
	is := is.New(t)
	lib := openCPU(t)
	c := tinyDraft()
	m, spec := loadDraft(t, lib, c)
	e, err := lib.Estimate(spec)
	is.NoErr(err)
	is.Equal(e.KVBytesPerToken, m.Info().KVBytesPerToken)
	is.Equal(m.Info().KVBytesPerToken, uint64(c.layers*c.headsKV*c.headDim*4*2))

	s := must(m.NewSeq())
	rng := rand.New(rand.NewPCG(3, 4))
	_, err = m.DraftForward([]DraftEntry{{Seq: s, Features: randomFeatures(rng, 10, c.feat)}}, 1)
	is.NoErr(err)
	is.NoErr(m.Snapshot(s))
	_, err = m.DraftForward([]DraftEntry{{Seq: s, Features: randomFeatures(rng, 4, c.feat)}}, 1)
	is.NoErr(err)
	is.Equal(must(m.SeqLen(s)), 14)
	is.NoErr(m.Rollback(s))
	is.Equal(must(m.SeqLen(s)), 10)
	is.NoErr(m.Truncate(s, 6))
	is.Equal(must(m.SeqLen(s)), 6)
	st, err := m.KVStats()
	is.NoErr(err)
	is.Equal(st.BlocksTotal-st.BlocksFree, 1) // 6 tokens in blocks of 8: the block rows were not kept
}
